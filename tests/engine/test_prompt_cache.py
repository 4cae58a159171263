"""The prompt cache beyond the KV pool (engine/prompt_cache.py): after a restart a prompt sharing a
2,000-token prefix starts from the blocks on disk (cached_tokens) with the cold run's output; a corrupt,
truncated or foreign file is detected and recomputed; a failed write is logged and forgotten; RAM and disk
stay within the size bound."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgellm import LLM, SamplingParams
from edgellm.engine.prompt_cache import PromptCache, block_digests
from edgellm.testing.synthetic.models import write_tiny_model

BS = 16  # EngineConfig.block_size
PREFIX = 2000
GREEDY = SamplingParams(max_tokens=8, temperature=0, logit_bias={0: -100, 1: -100, 2: -100})


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("prompt-cache-models")
    a = write_tiny_model(d / "a.gguf", "qwen3", context_length=4096)
    b = write_tiny_model(d / "b.gguf", "qwen3", context_length=4096, seed=1)
    return a, b


def _run(model: Path, cache: Path | None, prompt: list[int]) -> tuple[list[int], int]:
    kw = {"prompt_cache": str(cache)} if cache is not None else {}
    with LLM(model, n_ctx=4096, kv_cache_memory=1 << 24, **kw) as llm:
        out = llm.generate([prompt], GREEDY)[0]
    return out.outputs[0].token_ids, out.metrics.num_cached_tokens


def _files(cache: Path) -> dict[bytes, Path]:
    return {bytes.fromhex(p.stem): p for p in cache.glob("*/*.kv")}


def test_a_restart_starts_from_the_cached_prefix(models: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = models
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(3, 200, PREFIX + 7)]
    cold, cached = _run(a, tmp_path, prompt)
    assert cached == 0
    digests = block_digests(prompt, BS)
    files = _files(tmp_path)
    assert set(digests) <= set(files)  # every full block of the prompt is on disk

    warm, cached = _run(a, tmp_path, prompt)  # a new core process: nothing in its pool
    assert cached >= 1900 and warm == cold

    # Block 10 corrupt, block 20 truncated: the hit stops at block 10, both files are deleted, the
    # output is still the cold one.
    bad = bytearray(files[digests[10]].read_bytes())
    bad[-1] ^= 0xFF
    files[digests[10]].write_bytes(bytes(bad))
    files[digests[20]].write_bytes(files[digests[20]].read_bytes()[:100])
    again, cached = _run(a, tmp_path, prompt)
    assert cached == 10 * BS and again == cold
    assert not files[digests[10]].exists() or files[digests[10]].read_bytes() != bytes(bad)

    # Another model's blocks live under its own identity; one moved under this model's name is refused.
    other, cached = _run(b, tmp_path, prompt)
    assert cached == 0
    b_dir = next(p for p in tmp_path.iterdir() if p != files[digests[0]].parent)
    foreign = b_dir / f"{digests[0].hex()}.kv"
    assert foreign.exists()
    shutil.copy(foreign, files[digests[0]])
    again, cached = _run(a, tmp_path, prompt)
    assert cached == 0 and again == cold


def test_the_store_checks_bounds_and_survives_a_failed_write(tmp_path: Path) -> None:
    ident = hashlib.sha256(b"model").digest()
    payload = bytes(range(256)) * 4  # 1 KiB
    store = PromptCache(tmp_path, 3 * 1024, ident)
    keys = [hashlib.sha256(bytes([i])).digest() for i in range(5)]
    for k in keys:
        store.put(k, payload)
    store.flush()
    assert len(list(store.dir.glob("*.kv"))) == 2  # header + 1 KiB each: the oldest went
    assert keys[0] not in store and keys[4] in store
    reopened = PromptCache(tmp_path, 3 * 1024, ident)
    reopened._ram.clear()  # (fresh anyway) read from disk, checked
    assert reopened.get(keys[4]) == payload and reopened.get(keys[0]) is None
    assert PromptCache(tmp_path, 3 * 1024, hashlib.sha256(b"other").digest()).get(keys[4]) is None

    shutil.rmtree(store.dir)  # the directory gone (a full or vanished disk): logged, not raised
    store.put(hashlib.sha256(b"late").digest(), payload)
    store.flush()
    assert store.write_errors == 1
    assert store.get(hashlib.sha256(b"late").digest()) == payload  # still served from RAM
    store.close()


def test_a_restarted_server_reports_the_cached_prefix(models: tuple[Path, Path], tmp_path: Path) -> None:
    """`edgellm serve --prompt-cache DIR`, stopped (Ctrl-C) and started again: the same chat's usage
    counts the prefix as cached_tokens and its reply is the first one."""
    import openai

    from edgellm.testing.servers import serve

    words = " ".join(f"w{i % 97} x{i % 89}" for i in range(300))
    chat = [{"role": "system", "content": words}, {"role": "user", "content": "and then?"}]
    replies = []
    for _ in range(2):
        for url in serve(models[0], "--prompt-cache", str(tmp_path), ctx=4096):
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
            r = client.chat.completions.create(model="tiny", messages=chat, max_tokens=8, temperature=0,
                                               logit_bias={"0": -100, "1": -100, "2": -100})  # fmt: skip
            replies.append((r.choices[0].message.content, r.usage.prompt_tokens,
                            r.usage.prompt_tokens_details.cached_tokens))  # fmt: skip
    (first, n_prompt, cold), (again, _, warm) = replies
    assert n_prompt >= 2000 and cold == 0
    assert warm >= n_prompt - BS and again == first
