"""LoRA adapters against llama.cpp: the tiny llama base of edgellm/testing/lora_cases.py scored with adapter
A, with B, with both and with neither gives llama.cpp's logits (tests/fixtures/lora/lora.npz, written by
scripts/fixtures/make_lora_fixtures.py with llama-cpp-python 0.3.36) within the float bound."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from edgellm.testing.lora_cases import CONFIGS, NMSE_LIMIT, config_choice, write_lora_files
from edgellm.testing.oracle_case import nmse, score_edgellm, top1_agreement
from edgellm.testing.paths import FIXTURES

FIXTURE = FIXTURES / "lora" / "lora.npz"


@pytest.fixture(scope="module")
def files(tmp_path_factory):  # noqa: ANN001, ANN201
    base, adapters = write_lora_files(tmp_path_factory.mktemp("lora"))
    ref = np.load(FIXTURE)
    for path in [base, *adapters]:  # the fixture was made from these exact bytes
        assert hashlib.sha256(path.read_bytes()).hexdigest() == str(ref["sha256_" + path.stem]), path.name
    return base, adapters, ref


@pytest.mark.parametrize("config", list(CONFIGS))
def test_logits_match_llamacpp(files, config: str) -> None:  # noqa: ANN001
    base, adapters, ref = files
    tokens, positions = ref["tokens"], ref["positions"]
    got = score_edgellm(base, tokens, positions, 512, adapters=tuple(adapters), lora=config_choice(config))
    want = ref["logits_" + config]
    assert nmse(got, want) < NMSE_LIMIT, (config, nmse(got, want))
    agree, counted = top1_agreement(got, want)
    assert agree == counted, (config, agree, counted)
    if config != "none":  # the adapter changes the logits far beyond the bound: the match is not vacuous
        assert nmse(ref["logits_none"], want) > 100 * NMSE_LIMIT
