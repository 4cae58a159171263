"""Split GGUF models (llama.cpp's gguf-split layout, written by gguf-py's GGUFWriter): every part is read,
the model is the same as the unsplit file, and a part that is missing, foreign or duplicated is an error
naming it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError, load_gguf_part
from edgellm.testing.gguf.edit import read_editable, serialize
from edgellm.testing.limits import HANG_S
from edgellm.testing.synthetic.models import write_tiny_model

PARTS = 3  # the tiny llama's 21 tensors, 8 a part


@pytest.fixture
def split_model(tmp_path: Path) -> tuple[Path, Path]:
    """(the unsplit file, the first of its 3 parts): the same seed, so the same weights."""
    whole = write_tiny_model(tmp_path / "whole.gguf", "llama", n_vocab=1200)  # bench prompts: ids < 1100
    (tmp_path / "split").mkdir()
    first = write_tiny_model(tmp_path / "split" / "tiny.gguf", "llama", n_vocab=1200, split_max_tensors=8)
    assert first.name == f"tiny-00001-of-{PARTS:05d}.gguf"
    return whole, first


def _part(first: Path, no: int) -> Path:
    return first.with_name(f"tiny-{no:05d}-of-{PARTS:05d}.gguf")


def _set_field(path: Path, key: str, value: int) -> None:
    model = read_editable(path)
    field = model.find(key)
    assert field is not None
    field.value = value
    path.write_bytes(serialize(model))


def test_the_parts_join_into_the_unsplit_model(split_model: tuple[Path, Path]) -> None:
    whole, first = split_model
    one, joined = load_gguf(whole), load_gguf(first)
    assert joined.parts == tuple(_part(first, i) for i in range(1, PARTS + 1))
    assert load_gguf_part(first).tensors.keys() < joined.tensors.keys()  # the first part alone is not all
    assert joined.tensors.keys() == one.tensors.keys()
    for name, t in one.tensors.items():
        assert joined.tensors[name].shape == t.shape and joined.tensors[name].qtype == t.qtype
        assert np.array_equal(joined.tensors[name].data, t.data), name
    assert joined.file_size == sum(p.stat().st_size for p in joined.parts)
    assert not any(k.startswith("split.") for k in one.metadata)
    assert joined.metadata.keys() - one.metadata.keys() == {"split.no", "split.count", "split.tensors.count"}
    for key, value in one.metadata.items():
        assert np.array_equal(joined.metadata[key], value), key


def test_a_split_model_generates_what_the_unsplit_file_does(split_model: tuple[Path, Path]) -> None:
    """In process and behind the server: the same greedy tokens as the one-file model."""
    from edgellm import LLM, SamplingParams
    from edgellm.testing.servers import httpx, start_server, stop_server  # httpx: the openai client's

    whole, first = split_model
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    outputs = []
    for path in (whole, first):
        with LLM(path, n_ctx=128, kv_cache_memory=1 << 20) as llm:
            outputs.append(llm.generate(["hello world"], greedy)[0])
    assert len(outputs[0].token_ids) > 1 and outputs[1].token_ids == outputs[0].token_ids
    proc, url = start_server(str(first), "--ctx", "128", "--kv-cache-memory", "1M")
    try:
        body = {"prompt": "hello world", "max_tokens": 12, "temperature": 0}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    finally:
        stop_server(proc)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == outputs[0].text


def test_a_missing_part_is_named(split_model: tuple[Path, Path]) -> None:
    _, first = split_model
    _part(first, 2).unlink()
    with pytest.raises(GGUFError, match=r"part 2 of this 3-part split model is missing: .*-00002-of-00003"):
        load_gguf(first)


def test_a_part_of_another_model_is_named(split_model: tuple[Path, Path]) -> None:
    _, first = split_model
    _set_field(_part(first, 3), "split.count", 4)
    with pytest.raises(
        GGUFError, match=r"00003-of-00003.gguf: does not belong with .*4 / 2 / 21, expected 3"
    ):
        load_gguf(first)


def test_a_duplicated_tensor_is_named(split_model: tuple[Path, Path]) -> None:
    _, first = split_model
    shutil.copy(_part(first, 2), _part(first, 3))  # part 2's tensors twice
    _set_field(_part(first, 3), "split.no", 2)
    with pytest.raises(GGUFError, match=r"tiny-00003-of-00003.gguf: tensor '.*' is also in .*tiny-00002"):
        load_gguf(first)


def test_a_tensor_count_that_disagrees_is_an_error(split_model: tuple[Path, Path]) -> None:
    _, first = split_model
    for no in range(1, PARTS + 1):
        _set_field(_part(first, no), "split.tensors.count", 22)
    with pytest.raises(GGUFError, match="split.tensors.count is 22, but the 3 parts hold 21 tensors"):
        load_gguf(first)


def test_a_later_part_is_refused_with_the_first_ones_name(split_model: tuple[Path, Path]) -> None:
    _, first = split_model
    with pytest.raises(
        GGUFError, match=r"part 2 of a 3-part split model .* load the first part, ...-00001-of-00003"
    ):
        load_gguf(_part(first, 2))


def test_a_renamed_first_part_cannot_find_the_others(split_model: tuple[Path, Path]) -> None:
    _, first = split_model
    renamed = first.with_name("tiny.gguf")
    first.rename(renamed)
    with pytest.raises(GGUFError, match="does not end in -00001-of-00003.gguf"):
        load_gguf(renamed)


def test_split_keys_of_one_file_that_disagree_are_an_error(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "one.gguf", "llama", metadata_overrides={"split.no": 1})
    with pytest.raises(GGUFError, match="corrupt split metadata: split.no = 1, split.count = 1"):
        load_gguf(path)
    path = write_tiny_model(tmp_path / "one.gguf", "llama", metadata_overrides={"split.count": 1})
    assert len(load_gguf(path).tensors) == 21  # a 1-part split model is just a file


def test_a_truncated_part_is_named(split_model: tuple[Path, Path]) -> None:
    _, first = split_model
    part = _part(first, 3)
    part.write_bytes(part.read_bytes()[:-100])
    with pytest.raises(GGUFError, match=r"tiny-00003-of-00003.gguf: truncated GGUF file"):
        load_gguf(first)


def test_bench_runs_a_split_model(split_model: tuple[Path, Path]) -> None:
    _, first = split_model
    proc = subprocess.run(
        [sys.executable, "-m", "edgellm", "bench", str(first), "--prompt-tokens", "8", "--gen-tokens", "4",
         "--repeat", "1", "--json", "--ctx", "128", "--kv-cache-memory", "1M"],
        capture_output=True, text=True, timeout=HANG_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["model"] == first.name and result["decode_tok_s"] > 0
    assert result["weight_bytes_vs_gguf"] > 0  # the matrices of all three parts counted
