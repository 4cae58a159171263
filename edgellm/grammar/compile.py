"""Grammars for constrained decoding, on llguidance (the Rust grammar engine llama.cpp and vLLM use): a JSON
Schema, a Lark or GBNF grammar, or a regular expression becomes one llguidance grammar string.

The caller's process only runs the cheap limit checks (edgellm.grammar.limits); llguidance compiles in a
worker process (edgellm.grammar.worker), so a grammar that cannot compile, or that crashes the native
compiler, is a GrammarError naming the problem before the request reaches the engine core. The core
builds one matcher per constrained sequence from that string and an llguidance tokenizer made from our
own vocabulary (grammar/native.py), the matcher a worker has already built once for that vocabulary."""

from __future__ import annotations

import json
from typing import Any

from edgellm.grammar.limits import GrammarError, check_grammar, check_regex, check_schema
from edgellm.grammar.worker import Job, Vocabulary, default_pool, vocab_key


def compile_grammar(
    json_schema: dict[str, Any] | str | bool | None = None,
    grammar: str | None = None,
    regex: str | None = None,
    vocab: Vocabulary | None = None,
) -> str | None:
    """The llguidance grammar for at most one of the three, validated; None when none is given.
    `json_schema` is a schema (dict or JSON text); True means any JSON object. `grammar` is Lark (llguidance's
    dialect) or llama.cpp's GBNF. With `vocab` (tokenizer, n_vocab) the matcher the engine core will build
    is built and must allow some output. Blocks until a worker answers (COMPILE_TIMEOUT_S at most)."""
    job = grammar_job(json_schema, grammar, regex)
    return None if job is None else default_pool().run(job, vocab)


async def compile_grammar_async(
    json_schema: dict[str, Any] | str | bool | None = None,
    grammar: str | None = None,
    regex: str | None = None,
    vocab: Vocabulary | None = None,
) -> str | None:
    """compile_grammar, awaited: for an event loop that must keep serving meanwhile (the limit checks
    run off the loop too)."""
    return await default_pool().off_loop(compile_grammar, json_schema, grammar, regex, vocab)


async def constrain_async(
    params: Any,
    vocab: Vocabulary,
    json_schema: dict[str, Any] | bool | None = None,
    grammar: str | None = None,
    regex: str | None = None,
) -> None:
    """Constrain `params` to one of the three, compiled off the event loop and checked against `vocab`, as
    SamplingParams(json_schema=...) followed by check_for_vocabulary would (without blocking the loop)."""
    if params.ignore_eos:
        raise GrammarError("ignore_eos cannot be combined with a grammar: a grammar ends with EOS")
    if params.min_tokens:
        raise GrammarError("min_tokens cannot be combined with a grammar: it ends the output")
    params.compiled_grammar = await compile_grammar_async(json_schema, grammar, regex, vocab)
    params.json_schema, params.grammar, params.regex = json_schema, grammar, regex
    params.grammar_vocab_key = vocab_key(vocab)


def check_for_vocabulary(params: Any, vocab: Vocabulary) -> None:
    """Make sure the engine core can build `params.compiled_grammar` for `vocab` (once per params: the
    key of the vocabulary it was checked against is kept on them)."""
    key = vocab_key(vocab)
    if params.compiled_grammar is not None and params.grammar_vocab_key != key:
        default_pool().run(("compiled", params.compiled_grammar), vocab)
        params.grammar_vocab_key = key


def grammar_job(
    json_schema: dict[str, Any] | str | bool | None, grammar: str | None, regex: str | None
) -> Job | None:
    """The source to compile, past the limit checks (GrammarError naming the limit), or None."""
    sources = (("json_schema", json_schema), ("grammar", grammar), ("regex", regex))
    given = [name for name, value in sources if value is not None]
    if not given:
        return None
    if len(given) > 1:
        raise GrammarError(f"give at most one of json_schema, grammar and regex (got {', '.join(given)})")
    if json_schema is not None:
        schema = {"type": "object"} if json_schema is True else json_schema
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError) as e:
                raise GrammarError(f"invalid json_schema: {e}") from None
        if not isinstance(schema, dict):
            raise GrammarError(f"json_schema must be a JSON object, got {type(schema).__name__}")
        check_schema(schema)
        return "json_schema", schema
    if grammar is not None:
        check_grammar(grammar)
        return "grammar", grammar
    check_regex(regex)
    return "regex", regex
