"""LoRA adapters against llama.cpp: each case of edgellm/testing/lora_cases.py (a tiny base scored with each
adapter, with both, with none, at the case's scales) gives llama.cpp's logits (tests/fixtures/lora/<case>.npz,
written by scripts/fixtures/make_lora_fixtures.py with llama-cpp-python 0.3.36) within the float bound."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from edgellm.testing.lora_cases import CASES, NMSE_LIMIT
from edgellm.testing.oracle.case import nmse, score_edgellm, top1_agreement
from edgellm.testing.paths import FIXTURES


@pytest.fixture(scope="module")
def written(tmp_path_factory):  # noqa: ANN001, ANN201
    """case -> (base, adapters, fixture), the files written once per case."""
    cache = {}

    def get(name: str):  # noqa: ANN202
        if name not in cache:
            base, adapters = CASES[name].write(tmp_path_factory.mktemp(name))
            ref = np.load(FIXTURES / "lora" / f"{name}.npz")
            for path in [base, *adapters]:  # the fixture was made from these exact bytes
                assert hashlib.sha256(path.read_bytes()).hexdigest() == str(ref["sha256_" + path.stem]), path
            cache[name] = base, adapters, ref
        return cache[name]

    return get


@pytest.mark.parametrize(("case", "config"), [(c, k) for c, case in CASES.items() for k in case.configs])
def test_logits_match_llamacpp(written, case: str, config: str) -> None:  # noqa: ANN001
    base, adapters, ref = written(case)
    lora = CASES[case].choice(config)
    got = score_edgellm(base, ref["tokens"], ref["positions"], 512, adapters=tuple(adapters), lora=lora)
    want = ref["logits_" + config]
    limit = max(NMSE_LIMIT, CASES[case].base.nmse_limit)
    assert nmse(got, want) < limit, (case, config, nmse(got, want))
    agree, counted = top1_agreement(got, want)
    assert agree == counted, (case, config, agree, counted)
    if config != "none":  # the adapter changes the logits far beyond the bound: the match is not vacuous
        assert nmse(ref["logits_none"], want) > 100 * NMSE_LIMIT
