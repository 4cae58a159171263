"""The serving engine, in two halves that meet at protocol.py's messages.

Front-end (any process: LLM, the server, the TUI): core_client (the core process's handle), frontend
(text: detokenization, stop strings), outputs (RequestOutput, the one delta accumulator), checks (the
front-end's prompt checks), config (EngineConfig: what the core is built from).

Engine core (its own process, core_process.EngineCoreProc): engine_core.EngineCore (the step loop),
request (a request's state, the stop rule), scheduler and scheduler_types, block_manager, prefix_cache,
sequence, pooling, guidance, model_runner, spec/. The front-end imports none of these
(tests/test_layering.py).
"""
