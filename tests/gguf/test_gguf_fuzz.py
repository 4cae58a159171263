"""Fuzzing the GGUF loader: a mutated model loads, tokenizes and generates 2 tokens, or raises GGUFError at
load. Nothing else: no other exception class, at load or after it.

Structured mutations (edgellm/testing/gguf/fuzz.py) edit small synthetic models of the four architectures:
every metadata value and value type, keys deleted and added, array element types, lengths and nesting,
key and string length fields, tensor dimensions, dimension counts, types, offsets and names, header counts,
the version, truncation. A second strategy writes consistent models of unusual shapes (1-wide and odd heads,
GQA groups up to 12, contexts of 2 tokens, rope widths). Each file is loaded by `LLM` in a long-lived child
process that also encodes and decodes a probe text and every token id and generates 2 greedy tokens; a
child killed by a signal (heap corruption in a kernel), exiting, or silent for HANG_TIMEOUT seconds fails
the test with the mutations that did it, and a fresh child takes over. A third test flips, inserts,
deletes and cuts raw bytes of a valid file and runs reader, config, validator and tokenizer (encoding and
decoding) in process (no kernels).

The default run takes about 20 s (1,000 + 100 child examples, 1,000 raw ones); a longer run:

    EDGELLM_FUZZ_EXAMPLES=5000 python -m pytest -q tests/gguf/test_gguf_fuzz.py

(5,000 structured + 500 shaped child examples, 5,000 raw ones) prints, in pytest's summary, how many
examples loaded and generated, raised GGUFError, or failed (error / signal / exit / hang).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.validation import tokenizer_from_gguf, validate_model
from edgellm.testing.gguf.edit import read_editable, serialize
from edgellm.testing.gguf.fuzz import apply, mutations
from edgellm.testing.gguf.fuzz_worker import LoadWorker, exercise_tokenizer
from edgellm.testing.limits import HANG_S
from edgellm.testing.paths import ROOT
from edgellm.testing.synthetic.models import spm_vocab, write_tiny_model

REPO = ROOT
EXAMPLES = int(os.environ.get("EDGELLM_FUZZ_EXAMPLES", "0"))
STRUCTURED_EXAMPLES = EXAMPLES or 1000
SHAPE_EXAMPLES = EXAMPLES // 10 or 100
RAW_EXAMPLES = EXAMPLES or 1000
# one load + 2 tokens of a tiny model: tens of ms normally, but a mutant may need a kernel compiled
HANG_TIMEOUT = HANG_S
# Outcomes per strategy: child worker ok / gguf_error / error / signal / exit / hang; raw: loaded / gguf_error
STATS: dict[str, Counter[str]] = {"structured": Counter(), "shapes": Counter(), "raw bytes": Counter()}

# Base models: (name, arch, write_tiny_model keyword arguments). Quantized and float weights, GQA groups of
# 2 and 4, tied embeddings, and F32 models whose tensors stay valid when the shapes are reread differently.
BASES = [
    ("llama-mix", "llama", {}),
    ("llama-f32-gqa4-tied", "llama", {"qtypes": "F32", "n_kv_heads": 1, "tied": True}),
    ("qwen2-q8", "qwen2", {"qtypes": "Q8_0"}),
    ("qwen3-mix", "qwen3", {}),
    ("gemma3-f16", "gemma3", {"qtypes": "F16", "n_layers": 1}),
]


class Bases(list):
    """(name, arch, EditableGGUF) of each base model; a short repr for hypothesis' failure reports."""

    def __repr__(self) -> str:
        return f"<{len(self)} base models: {', '.join(name for name, _, _ in self)}>"


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Bases:
    root = tmp_path_factory.mktemp("fuzz-bases")
    out = Bases()
    for name, arch, kwargs in BASES:
        path = write_tiny_model(root / f"{name}.gguf", arch, **kwargs)
        out.append((name, arch, read_editable(path)))
    return out


class FuzzSummary:
    """A pytest plugin registered by the module: prints the example counts in the terminal summary (output of
    a fixture's teardown is captured)."""

    worker: LoadWorker | None = None

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001 - pytest's hook signature
        for what, stats in STATS.items():
            if stats:
                counts = ", ".join(f"{k} {v}" for k, v in sorted(stats.items()))
                terminalreporter.write_line(f"GGUF fuzz, {what}: {sum(stats.values())} examples: {counts}")
        if self.worker is not None:
            terminalreporter.write_line(f"GGUF fuzz: child worker restarts {self.worker.restarts}")


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> FuzzSummary:
    plugin = FuzzSummary()
    request.config.pluginmanager.register(plugin, "gguf-fuzz-summary")
    return plugin


@pytest.fixture(scope="module")
def worker(summary: FuzzSummary):
    summary.worker = w = LoadWorker(REPO)
    yield w
    w.close()


FAKE_WORKER = """
import json, os, sys, time
print(json.dumps({"kind": "ready"}), flush=True)
for line in sys.stdin:
    path = line.strip()
    if path == "abort":
        os.abort()
    if path == "hang":
        time.sleep(600)
    print(json.dumps({"kind": "ok", "detail": path}), flush=True)
"""


def test_worker_reports_signals_and_hangs_and_restarts(tmp_path: Path) -> None:
    """The harness against a stand-in worker that aborts or sleeps on request."""
    w = LoadWorker(tmp_path, command=[sys.executable, "-c", FAKE_WORKER])
    try:
        assert w.load("a", timeout=60) == ("ok", "a")
        kind, detail = w.load("abort", timeout=60)
        assert kind == "signal" and "exit status -6" in detail
        assert w.load("b", timeout=60) == ("ok", "b")
        assert w.load("hang", timeout=1)[0] == "hang"
        assert w.load("c", timeout=60) == ("ok", "c")
        assert w.restarts == 2
    finally:
        w.close()


def test_worker_loads_every_base_model(worker: LoadWorker, bases, tmp_path: Path) -> None:
    """The harness itself: every unmutated base model loads and generates (so 'ok' is reachable), the
    first call also pays the child's start-up."""
    for name, _, model in bases:
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(serialize(model))
        kind, detail = worker.load(path, timeout=HANG_S)
        assert kind == "ok", f"{name}: {kind}: {detail}"


def test_a_tokenizer_that_loads_but_cannot_encode_is_a_gguf_error(worker: LoadWorker, tmp_path: Path) -> None:
    """The mutant that once loaded and then raised TokenizerError on the first prompt: a vocabulary without
    one byte-fallback token is a GGUFError at load, naming the key."""
    tokens, types, _ = spm_vocab()
    newline = tokens.index("<0x0A>")
    tokens[newline], types[newline] = "<0x0A>x", 1
    overrides = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    path = write_tiny_model(tmp_path / "m.gguf", "gemma3", n_layers=1, metadata_overrides=overrides)
    kind, detail = worker.load(path, timeout=HANG_S)
    assert kind == "gguf_error", detail
    assert detail.startswith("TokenizerMetadataError: <file>: tokenizer.ggml.tokens:") and "<0x0A>" in detail


@settings(
    max_examples=STRUCTURED_EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
def test_mutated_gguf_loads_or_raises_gguf_error(worker: LoadWorker, bases, tmp_path: Path, data) -> None:
    name, arch, model = bases[data.draw(st.integers(0, len(bases) - 1), label="base")]
    muts = data.draw(mutations(model, arch), label="mutations")
    path = tmp_path / "mutated.gguf"
    path.write_bytes(serialize(apply(model, muts)))
    kind, detail = worker.load(path, timeout=HANG_TIMEOUT)
    STATS["structured"][kind] += 1
    assert kind in ("ok", "gguf_error"), f"{kind} for {name} + {[m.describe() for m in muts]}:\n{detail}"


@st.composite
def model_shapes(draw: st.DrawFn) -> dict:
    """Consistent models (tensors shaped as the metadata says) of unusual sizes: 1-wide heads, odd head
    sizes, GQA groups past the attention IR kernels' 8, one KV head, head sizes unlike n_embd / n_heads,
    plus an optional rope width, which must stay within the head."""
    n_kv = draw(st.integers(1, 4))
    kwargs = dict(
        n_layers=draw(st.integers(1, 2)),
        n_embd=draw(st.sampled_from([32, 64, 96])),
        n_kv_heads=n_kv,
        n_heads=n_kv * draw(st.integers(1, 12)),
        head_dim=draw(st.sampled_from([1, 2, 3, 4, 8, 15, 16, 34, 64])),
        n_ff=draw(st.sampled_from([32, 64, 96])),
        context_length=draw(st.sampled_from([2, 3, 17, 256])),
        tied=draw(st.booleans()),
    )
    arch = draw(st.sampled_from(["llama", "qwen2", "qwen3", "gemma3"]))
    rope = draw(st.one_of(st.none(), st.sampled_from([0, 1, 2, 4, 6, 16, 64, 2**31 - 1])))
    if rope is not None:
        kwargs["metadata_overrides"] = {f"{arch}.rope.dimension_count": rope}
    # Block-32 types where every row length of these sizes allows them; attn_output's rows are H * d long.
    block32 = draw(st.sampled_from(["Q8_0", "Q4_0", "Q5_1"]))
    qtypes = draw(st.sampled_from(["F32", "F16", "BF16", {"*": block32, "attn_output": "F16"}]))
    return dict(arch=arch, qtypes=qtypes, **kwargs)


@settings(
    max_examples=SHAPE_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(shape=model_shapes())
def test_unusual_consistent_shapes_load_or_raise_gguf_error(
    worker: LoadWorker, tmp_path: Path, shape
) -> None:
    """Weights of types that hold any of these row lengths: only the metadata decides what runs."""
    path = write_tiny_model(tmp_path / "shaped.gguf", **shape)
    kind, detail = worker.load(path, timeout=HANG_TIMEOUT)
    STATS["shapes"][kind] += 1
    assert kind in ("ok", "gguf_error"), f"{kind} for write_tiny_model(**{shape}):\n{detail}"


@pytest.fixture(scope="module")
def valid_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny_model(tmp_path_factory.mktemp("raw") / "m.gguf", "qwen2").read_bytes()


@st.composite
def byte_edits(draw: st.DrawFn, size: int) -> list[tuple]:
    """Flips, overwrites with boundary bytes, inserted and deleted runs, and a final cut."""
    pos = st.integers(0, size - 1)
    edit = st.one_of(
        st.tuples(st.just("xor"), pos, st.integers(1, 255)),
        st.tuples(st.just("set"), pos, st.sampled_from([b"\x00" * 8, b"\xff" * 8, b"\x7f", b"\x80"])),
        st.tuples(st.just("insert"), pos, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("delete"), pos, st.integers(1, 64)),
    )
    edits = draw(st.lists(edit, min_size=0, max_size=6))
    if draw(st.booleans()):
        edits.append(("cut", draw(pos), 0))
    return edits


def apply_byte_edits(raw: bytes, edits: list[tuple]) -> bytes:
    out = bytearray(raw)
    for kind, at, arg in edits:
        at = min(at, len(out))
        if kind == "xor" and at < len(out):
            out[at] ^= arg
        elif kind == "set":
            out[at : at + len(arg)] = arg
        elif kind == "insert":
            out[at:at] = arg
        elif kind == "delete":
            del out[at : at + arg]
        elif kind == "cut":
            del out[at:]
    return bytes(out)


@settings(
    max_examples=RAW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_raw_byte_mutations_raise_only_gguf_error(valid_bytes: bytes, tmp_path: Path, data) -> None:
    """Reader, config, validator and tokenizer on arbitrarily damaged bytes: a usable model or GGUFError."""
    edits = data.draw(byte_edits(len(valid_bytes)), label="edits")
    path = tmp_path / "damaged.gguf"
    path.write_bytes(apply_byte_edits(valid_bytes, edits))
    try:
        g = load_gguf(path)
        validate_model(g, config_from_gguf(g))
        exercise_tokenizer(tokenizer_from_gguf(g))
        STATS["raw bytes"]["loaded"] += 1
    except GGUFError:
        STATS["raw bytes"]["gguf_error"] += 1
