"""Images through a gemma3 mmproj (edgellm/vision/) against llama.cpp's libmtmd: on the tiny random
vision case (edgellm/testing/vision_case.py) the prompt's token ids, the logits after the image and the
greedy continuation match the committed fixture (scripts/fixtures/make_vision_fixture.py); the engine
computes a non-causal image in one step whatever its chunk size, keys the prefix cache by the image's
content, and bad images and image prompts are refused with clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgellm.arch import ARCHITECTURES
from edgellm.backends.cpu.backend import CpuBackend
from edgellm.engine.engine_core import EngineCore
from edgellm.engine.media import media_rows
from edgellm.engine.model_runner import ModelRunner, RunItem
from edgellm.engine.scheduler import SchedulerConfig
from edgellm.gguf.config import config_from_gguf
from edgellm.gguf.load import load_gguf
from edgellm.gguf.reader import GGUFError
from edgellm.gguf.validation import tokenizer_from_gguf, validate_model
from edgellm.sampling.sampler import SamplingParams
from edgellm.testing.oracle.case import nmse, top1_agreement
from edgellm.testing.paths import FIXTURES
from edgellm.testing.synthetic.mmproj import tiny_png, write_tiny_mmproj
from edgellm.testing.vision_case import CASES, N_CTX, N_EMBD, N_GREEDY, PROMPT, digest, write_case
from edgellm.vision import load_mmproj
from edgellm.vision.image import ImageError
from edgellm.vision.prompt import image_prompt

FIXTURE = FIXTURES / "vision" / "gemma3.npz"
# docs/oracle_cases.md allows 1e-4 for float weights; these cases (float32 text model, every kernel input
# the same as llama.cpp's) measure 5e-10..2e-9, and the mistakes the negative tests below make measure
# 2e-5 (windows from the image's end) and 3e-4 (a causal image): 1e-6 tells them apart with 500x margin
NMSE_LIMIT = 1e-6


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    tmp = tmp_path_factory.mktemp("vision")
    model, mmproj, png = write_case(tmp)
    ref = np.load(FIXTURE)
    assert str(ref["sha256"]) == digest(model, mmproj, png), (
        "the case's files changed: regenerate with scripts/fixtures/make_vision_fixture.py"
    )
    g = load_gguf(str(model))
    cfg = config_from_gguf(g)
    validate_model(g, cfg)
    cfg.set_context(N_CTX)
    tok = tokenizer_from_gguf(g)
    encoder = load_mmproj(mmproj, cfg.n_embd)
    model_obj = ARCHITECTURES[cfg.arch](cfg, g, CpuBackend())
    return {"cfg": cfg, "tok": tok, "encoder": encoder, "model": model_obj, "png": png, "ref": ref,
            "mmproj": mmproj}  # fmt: skip


def _engine(case, chunk: int, caching: bool = False) -> EngineCore:  # noqa: ANN001
    n_blocks = 32
    runner = ModelRunner(case["model"], case["cfg"], CpuBackend(), n_blocks, 16)
    sched = SchedulerConfig(2, chunk, 16, n_blocks, enable_prefix_caching=caching)
    return EngineCore(runner, frozenset(), N_CTX, sched)


def _greedy(engine: EngineCore, ids: list[int], media) -> tuple[list[int], int]:  # noqa: ANN001
    rid = engine.add_request(ids, SamplingParams(max_tokens=N_GREEDY, temperature=0.0), media=media)
    toks, cached = [], 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                toks += out.new_token_ids
                cached = max(cached, out.num_cached_tokens)
    return toks, cached


def test_prompt_ids_match_mtmd_tokenize(case) -> None:  # noqa: ANN001
    ids, spans = image_prompt(case["tok"], case["encoder"], PROMPT, [case["png"]])
    got = np.array(ids)
    got[spans[0].start : spans[0].end] = -1
    np.testing.assert_array_equal(got, case["ref"]["prompt_ids"])
    assert spans[0].embeds.shape == (16, N_EMBD) and spans[0].non_causal


@pytest.mark.parametrize("name", list(CASES))
def test_logits_after_the_image_match_llamacpp(case, tmp_path: Path, name: str) -> None:  # noqa: ANN001
    """The whole prompt in one pass, then llama.cpp's greedy tokens one by one: every step's logits. With
    an F16 mmproj (as real files are) clip.cpp's matmuls take f16 activations: gemma3.py rounds them."""
    ref = np.load(FIXTURES / "vision" / f"{name}.npz")
    model, mmproj, png = write_case(tmp_path, name)
    assert str(ref["sha256"]) == digest(model, mmproj, png), (
        "regenerate: scripts/fixtures/make_vision_fixture.py"
    )
    encoder = load_mmproj(mmproj, N_EMBD)
    ids, spans = image_prompt(case["tok"], encoder, CASES[name][1], [png])
    got_ids = np.array(ids)
    got_ids[spans[0].start : spans[0].end] = -1
    np.testing.assert_array_equal(got_ids, ref["prompt_ids"])
    runner = ModelRunner(case["model"], case["cfg"], CpuBackend(), 16, 16)
    table = list(range(16))
    rows = [runner.run([RunItem(table, ids, 0, media=media_rows(spans, 0, len(ids)))])[0][-1]]
    for i, t in enumerate(ref["greedy"][:-1].tolist()):
        rows.append(runner.run([RunItem(table, [t], len(ids) + i)])[0][-1])
    got, want = np.array(rows), ref["logits"]
    err = nmse(got, want)
    agree, decided = top1_agreement(got, want)
    print(f"vision {name}: NMSE {err:.2e}, top-1 {agree}/{decided}")
    assert err < NMSE_LIMIT
    assert agree == decided > 0


def test_without_the_image_attending_both_ways_the_logits_differ(case) -> None:  # noqa: ANN001
    """The non-causal image matters: computed causally, the logits leave llama.cpp's (the test above can
    fail)."""
    ids, spans = image_prompt(case["tok"], case["encoder"], PROMPT, [case["png"]])
    spans[0].non_causal = False
    runner = ModelRunner(case["model"], case["cfg"], CpuBackend(), 8, 16)
    row = runner.run([RunItem(list(range(8)), ids, 0, media=media_rows(spans, 0, len(ids)))])[0][-1]
    assert nmse(row[None], case["ref"]["logits"][:1]) > NMSE_LIMIT  # (~3e-4; non-causal: ~2e-9)


@pytest.mark.parametrize("chunk", [20, 512])
def test_engine_greedy_matches_llamacpp_in_any_chunking(case, chunk: int) -> None:  # noqa: ANN001
    """Chunks of 20 tokens would end inside the image (positions 29..45): the scheduler stops the chunk
    before it and computes the image in the next step."""
    ids, spans = image_prompt(case["tok"], case["encoder"], PROMPT, [case["png"]])
    toks, _ = _greedy(_engine(case, chunk), ids, spans)
    assert toks == case["ref"]["greedy"].tolist()


def test_prefix_cache_is_keyed_by_the_image(case) -> None:  # noqa: ANN001
    engine = _engine(case, 512, caching=True)
    ids, spans = image_prompt(case["tok"], case["encoder"], PROMPT, [case["png"]])
    first, cached0 = _greedy(engine, ids, spans)
    again, cached1 = _greedy(engine, ids, spans)
    assert cached0 == 0 and cached1 >= 48 and again == first == case["ref"]["greedy"].tolist()
    other = tiny_png(40, 24, seed=9)
    ids2, spans2 = image_prompt(case["tok"], case["encoder"], PROMPT, [other])
    assert ids2 == ids  # the same token ids: only the image differs
    _, cached2 = _greedy(engine, ids2, spans2)
    assert cached2 <= spans2[0].start  # no block holding the first image's tokens is reused


def test_an_image_too_big_for_one_step_is_refused(case) -> None:  # noqa: ANN001
    ids, spans = image_prompt(case["tok"], case["encoder"], PROMPT, [case["png"]])
    with pytest.raises(ValueError, match="does not fit one step"):
        _greedy(_engine(case, 8), ids, spans)


def test_bad_images_and_prompts_are_clear_errors(case, tmp_path: Path) -> None:  # noqa: ANN001
    tok, enc = case["tok"], case["encoder"]
    with pytest.raises(ImageError, match="cannot decode"):
        image_prompt(tok, enc, PROMPT, [b"\x89PNG\r\n\x1a\n not really"])
    with pytest.raises(ImageError, match="takes no images"):
        image_prompt(tok, None, PROMPT, [case["png"]])
    with pytest.raises(ImageError, match="2 media markers"):
        image_prompt(tok, enc, PROMPT + " <__media__>", [case["png"]])
    with pytest.raises(GGUFError, match="'idefics3' is not supported"):
        load_mmproj(write_tiny_mmproj(tmp_path / "i3.gguf", N_EMBD, projector="idefics3"))
    with pytest.raises(GGUFError, match="for another model"):
        load_mmproj(case["mmproj"], N_EMBD * 2)


def test_oversized_and_too_many_images_are_refused(case, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    tok, enc = case["tok"], case["encoder"]
    monkeypatch.setattr("edgellm.vision.image.MAX_IMAGE_PIXELS", 500)  # the 40 x 24 test image: 960
    with pytest.raises(ImageError, match="960 pixels|40x24 pixels"):
        image_prompt(tok, enc, PROMPT, [case["png"]])
    monkeypatch.undo()
    many = "<__media__>" * 17
    with pytest.raises(ImageError, match="at most 16"):
        image_prompt(tok, enc, many, [case["png"]] * 17)


def test_an_mmproj_for_a_text_model_without_image_support_is_refused(tmp_path: Path) -> None:
    """A llama text model as wide as the projector's output: the mmproj loads, the model cannot take the
    rows (its forward pass has no image hook yet), so LLM refuses at load naming the architecture."""
    from edgellm import LLM
    from edgellm.testing.synthetic.models import write_tiny_model

    model = write_tiny_model(tmp_path / "llama.gguf", "llama", qtypes="F32", n_embd=N_EMBD)
    mmproj = write_tiny_mmproj(tmp_path / "other.gguf", N_EMBD)
    with pytest.raises(ValueError, match="not supported for the llama architecture"):
        LLM(str(model), mmproj=str(mmproj))


def test_a_prefix_hit_that_ends_inside_the_image(case, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Blocks of 16: a second prompt with the same image and other text right after it reuses blocks 0-31,
    so its computation starts at position 32, inside the image (29..45); its answer equals the uncached
    one. (The text follows the image directly here: the tiny vocabulary spells <end_of_image> out in 15
    tokens, which would fill the block; a real Gemma 3 has one token there.)"""
    tok, enc, png = case["tok"], case["encoder"], case["png"]
    monkeypatch.setattr(enc.projector, "end", "")
    engine = _engine(case, 512, caching=True)
    _greedy(engine, *image_prompt(tok, enc, PROMPT, [png]))
    ids, spans = image_prompt(tok, enc, PROMPT.replace("and say", "then tell me more"), [png])
    assert spans[0].start < 32 < spans[0].end
    cached_toks, cached = _greedy(engine, ids, spans)
    fresh_toks, _ = _greedy(_engine(case, 512), ids, spans)
    assert cached == 32 and cached_toks == fresh_toks


def test_parallel_samples_keep_the_image(case) -> None:  # noqa: ANN001
    """n=2: the second completion is a fork of the first; it carries the images (a recompute after a
    preemption and its prefix-cache keys need them), and greedy, both give llama.cpp's tokens."""
    engine = _engine(case, 512, caching=True)
    ids, spans = image_prompt(case["tok"], case["encoder"], PROMPT, [case["png"]])
    rid = engine.add_request(ids, SamplingParams(n=2, max_tokens=N_GREEDY, temperature=0.0), media=spans)
    toks: dict[int, list[int]] = {0: [], 1: []}
    while engine.has_unfinished():
        for seq in engine.scheduler.running:
            assert seq.media == spans
        for out in engine.step():
            if out.request_id == rid:
                toks[out.index] += out.new_token_ids
    assert toks[0] == toks[1] == case["ref"]["greedy"].tolist()


def test_the_late_image_needs_windows_measured_from_each_token(
    case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """Without window_from_token (the kernel's window measured from the image's end) the late image's
    logits leave llama.cpp's: the gemma3_late case above can fail."""
    monkeypatch.setattr("edgellm.arch.common.window_from_token", lambda *a: None)
    ref = np.load(FIXTURES / "vision" / "gemma3_late.npz")
    model, mmproj, png = write_case(tmp_path, "gemma3_late")
    ids, spans = image_prompt(case["tok"], load_mmproj(mmproj, N_EMBD), CASES["gemma3_late"][1], [png])
    runner = ModelRunner(case["model"], case["cfg"], CpuBackend(), 16, 16)
    row = runner.run([RunItem(list(range(16)), ids, 0, media=media_rows(spans, 0, len(ids)))])[0][-1]
    assert nmse(row[None], ref["logits"][:1]) > NMSE_LIMIT
