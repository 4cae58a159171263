"""A crash-proof loader harness for the GGUF fuzz tests (tests/gguf/test_gguf_fuzz.py).

`LoadWorker` loads mutated files (edgellm/testing/gguf/fuzz.py) in a long-lived child process (`python -m
edgellm.testing.gguf.fuzz_worker`), which checks the file as `LLM` does, builds the engine core in-process,
tokenizes and detokenizes a probe text and every token id (a tokenizer that loads but cannot encode is a
finding, not a usable model) and greedily generates 2 tokens. The child answers "ok", "gguf_error" (a
GGUFError at load, its class named) or "error" (any other exception at load, or any exception after it, with
its traceback); a child killed by a signal, exiting, or silent past the timeout is reported as "signal" /
"exit" / "hang" and replaced by a fresh one: one bad file, one restart.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from edgellm.testing.limits import HANG_S

# Text every loaded tokenizer must encode: ASCII, whitespace, multi-byte and 4-byte UTF-8, a NUL, and text
# that looks like special tokens.
PROBE_TEXT = "Hello, world!\n\tÉtat 日本 🙂 <|im_end|><start_of_turn> \x00 ▁x"


def exercise_tokenizer(tokenizer: Any) -> None:
    """What a server does with a loaded model's tokenizer: encode a prompt and decode ids (all of them)."""
    ids = tokenizer.encode(PROBE_TEXT, add_special=True)
    tokenizer.decode(ids)
    tokenizer.decode(range(tokenizer.vocab_size))


def load_and_generate(path: str) -> tuple[str, str]:
    """(kind, detail): the model loads, its tokenizer encodes and decodes, and it generates 2 greedy tokens
    ("ok"); or loading raises GGUFError; or anything else ("error", with the traceback). The checks are
    LLM's front-end checks; the engine is the engine core LLM would start, built in this process so that a
    kernel fault kills this worker (a signal the parent reports) and no core process is started per
    example."""
    from edgellm.engine.config import EngineConfig
    from edgellm.engine.core_process import EngineCoreProc
    from edgellm.gguf.config import config_from_gguf
    from edgellm.gguf.load import load_gguf
    from edgellm.gguf.reader import GGUFError
    from edgellm.gguf.validation import tokenizer_from_gguf, validate_model
    from edgellm.sampling.sampler import SamplingParams

    try:
        gguf = load_gguf(path)
        cfg = config_from_gguf(gguf)
        validate_model(gguf, cfg)
        tokenizer = tokenizer_from_gguf(gguf)
        del gguf
        spec = EngineConfig(path, n_ctx=64, kv_cache_memory=1 << 20, threads=1, max_num_seqs=2)
        core = EngineCoreProc(spec)
    except GGUFError as e:
        return "gguf_error", f"{type(e).__name__}: {e}".replace(path, "<file>")
    except Exception:  # noqa: BLE001 - reported to the parent as a finding
        return "error", traceback.format_exc()
    try:
        exercise_tokenizer(tokenizer)
    except Exception:  # noqa: BLE001 - content the load let through and the tokenizer then refused
        return "error", "tokenize: " + traceback.format_exc()
    try:
        engine = core.engine_core
        engine.add_request([0], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        tokens: list[int] = []
        while engine.has_unfinished():
            tokens += [t for out in engine.step() for t in out.new_token_ids]
        return "ok", repr(tokens)
    except Exception:  # noqa: BLE001
        return "error", "generate: " + traceback.format_exc()


def worker_main() -> None:
    """Read file paths from stdin, answer one JSON line each on the original stdout (everything the model
    code prints goes to stderr instead)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    out.write(json.dumps({"kind": "ready"}) + "\n")
    for line in sys.stdin:
        kind, detail = load_and_generate(line.strip())
        out.write(json.dumps({"kind": kind, "detail": detail[-4000:]}) + "\n")


class LoadWorker:
    """The parent's handle on the child; `load` never raises for what the child does."""

    def __init__(
        self, cwd: str | Path, start_timeout: float = HANG_S, command: list[str] | None = None
    ) -> None:
        self.cwd, self.start_timeout = str(cwd), start_timeout
        # the worker's command line: this module's worker_main unless a test substitutes its own
        self.command = command or [sys.executable, "-m", "edgellm.testing.gguf.fuzz_worker"]
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._stderr = tempfile.TemporaryFile()

    def _start(self) -> None:
        env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
        self._stderr.seek(0)
        self._stderr.truncate()
        self.proc = subprocess.Popen(
            self.command,
            cwd=self.cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            text=True,
        )  # fmt: skip
        first = self._read_line(self.start_timeout)
        if not first or json.loads(first)["kind"] != "ready":
            raise RuntimeError(f"fuzz worker did not start: {self._stderr_tail()}")

    def _read_line(self, timeout: float) -> str | None:
        """The child's next line; "" when it closed its end (exited), None when it is silent past timeout."""
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else None

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-3000:].decode("utf-8", "replace")

    def load(self, path: str | Path, timeout: float) -> tuple[str, str]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{path}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._read_line(timeout)
        if line:
            answer = json.loads(line)
            return answer["kind"], answer["detail"]
        if line is None:
            self.proc.kill()
            self.proc.wait()
            result = ("hang", f"no answer in {timeout:.0f} s")
        else:  # end of its output: the child is gone; its exit status says how
            try:
                code = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
            result = ("signal" if code < 0 else "exit", f"exit status {code}: {self._stderr_tail()}")
        self.proc = None
        self.restarts += 1
        return result

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        self._stderr.close()


if __name__ == "__main__":
    worker_main()
