"""edgellm against llama.cpp's logits on every oracle case (edgellm/testing/oracle/cases.py): each
architecture, each quant type and each metadata feature, on tiny random-weight GGUFs scored over 1,100 tokens.

The fixtures (tests/fixtures/oracle/<case>.npz) are llama.cpp's logits, written by
scripts/fixtures/make_oracle_fixtures.py. The test rewrites each case's file, checks its sha256 against the
fixture's (a changed writer must regenerate the fixture, not be compared against another file's logits),
scores the tokens with edgellm and requires NMSE below the case's limit and the same top-1 token wherever
llama.cpp's top-2 gap exceeds TOP1_MIN_GAP. Figures: `pytest -s tests/gguf/test_oracle_cases.py` prints
one line per case.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from edgellm.arch.registry import supported_architectures
from edgellm.testing.oracle.cases import CASES, nmse, score_edgellm, top1_agreement
from edgellm.testing.paths import ORACLE_FIXTURES
from edgellm.testing.synthetic.encoder import ENCODER_ARCHS
from edgellm.testing.synthetic.models import ARCHS as SYNTHETIC_ARCHS

FIXTURES = ORACLE_FIXTURES


def test_every_architecture_has_a_case() -> None:
    """An architecture is its file in edgellm/arch/ (arch/registry.py finds it) and its test case: at least
    one oracle case, llama.cpp's logits on a tiny file of it, which the synthetic writer can write."""
    registered = set(supported_architectures()) - set(ENCODER_ARCHS)  # encoders: test_encoders.py
    missing = sorted(registered - {c.arch for c in CASES.values()})
    assert not missing, f"no oracle case for {missing}: add one to edgellm/testing/oracle/cases.py"
    assert registered == set(SYNTHETIC_ARCHS), f"synthetic.ARCHS {SYNTHETIC_ARCHS} != {sorted(registered)}"


def test_every_case_has_a_fixture() -> None:
    missing = [n for n in CASES if not (FIXTURES / f"{n}.npz").exists()]
    assert not missing, f"no fixture for {missing}: run scripts/fixtures/make_oracle_fixtures.py --missing"
    stale = sorted(p.stem for p in FIXTURES.glob("*.npz") if p.stem not in CASES)
    assert not stale, f"fixtures of no case: {stale}"


@pytest.mark.parametrize("name", list(CASES))
def test_case_matches_llamacpp(tmp_path: Path, name: str) -> None:
    case, fixture = CASES[name], FIXTURES / f"{name}.npz"
    if not fixture.exists():
        pytest.skip(f"no fixture {fixture.name} (test_every_case_has_a_fixture fails for it)")
    ref = np.load(fixture)
    path = case.write(tmp_path / f"{name}.gguf")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert sha == str(ref["gguf_sha256"]), (
        f"{name}: the writer now produces other bytes than the fixture's file: "
        f"regenerate with scripts/fixtures/make_oracle_fixtures.py {name}"
    )
    tokens, positions, want = ref["tokens"], ref["positions"], ref["logits"]
    np.testing.assert_array_equal(tokens, case.tokens(want.shape[1]))
    got = score_edgellm(path, tokens, positions, case.n_ctx)
    err = nmse(got, want)
    agree, decided = top1_agreement(got, want)
    print(
        f"\n{name}: NMSE {err:.2e} (limit {case.nmse_limit:.0e}; llama.cpp batched vs token by token "
        f"{float(ref['llamacpp_drift_nmse']):.1e}), top-1 {agree}/{decided}, max |dlogit| "
        f"{np.abs(got - want).max():.3f}  [{case.note}]"
    )
    assert err < case.nmse_limit, f"{name}: NMSE {err:.3e} >= {case.nmse_limit:.0e} ({case.note})"
    assert agree == decided, f"{name}: top-1 differs at {decided - agree} of {decided} decided positions"


def test_writer_is_deterministic_and_extra_tensors_change_nothing_else(tmp_path: Path) -> None:
    """The sha256 check above needs the same bytes from the same arguments; a case adding a tensor (a bias,
    rope_freqs.weight) must leave the other weights as they were."""
    import gguf

    from edgellm.testing.synthetic.models import Typed, write_tiny_model

    kw = dict(qtypes="Q8_0", seed=3, metadata_overrides={"llama.rope.scaling.factor": 2.0})
    a = write_tiny_model(tmp_path / "a.gguf", "llama", **kw)
    b = write_tiny_model(tmp_path / "b.gguf", "llama", **kw)
    assert a.read_bytes() == b.read_bytes()
    freqs = np.linspace(1.0, 8.0, 8, dtype=np.float32)
    c = write_tiny_model(
        tmp_path / "c.gguf",
        "llama",
        **kw | {"metadata_overrides": {"llama.x": Typed(7, gguf.GGUFValueType.UINT32)}},
        extra_tensors={"blk.0.attn_q.bias": (64,), "rope_freqs.weight": freqs},
    )
    ra, rc = gguf.GGUFReader(a), gguf.GGUFReader(c)
    base = {t.name: t.data.tobytes() for t in ra.tensors}
    extra = {t.name: t for t in rc.tensors if t.name not in base}
    assert {t.name: t.data.tobytes() for t in rc.tensors if t.name in base} == base
    assert sorted(extra) == ["blk.0.attn_q.bias", "rope_freqs.weight"]
    np.testing.assert_array_equal(extra["rope_freqs.weight"].data, freqs)
    assert extra["blk.0.attn_q.bias"].tensor_type == gguf.GGMLQuantizationType.F32
    assert 0.05 < float(np.std(extra["blk.0.attn_q.bias"].data)) < 0.2
    field = rc.fields["llama.x"]
    assert field.types == [gguf.GGUFValueType.UINT32] and field.contents() == 7
