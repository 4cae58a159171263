"""The CPU tier table (edgellm/backends/cpu/tiers.py): which tier a host gets, EDGELLM_CPU_TIER and its
errors, and each x86 tier's kernel IR compiled for a CPU that has only that tier's instruction set (the
assembly has the tier's dot-product instructions and no AVX-512 register), whatever this host is."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import llvmlite.binding as llb
import pytest
from llvmlite import ir

from edgellm.backends.cpu import silu_ir, tiers
from edgellm.backends.cpu.tile_layouts import TILE_LAYOUTS, T
from edgellm.backends.cpu.vnni_ir import build_tile_kernel

X86 = {"avx2": True, "fma": True, "f16c": True}
AVXVNNI = {**X86, "avxvnni": True}
AVX512 = {**AVXVNNI, "avx512f": True, "avx512bw": True, "avx512vnni": True, "avx512vl": True}


@pytest.mark.parametrize(
    "features, best",
    [({}, "portable"), ({"sse4.2": True}, "portable"), (X86, "avx2"), ({**X86, "f16c": False}, "portable"),
     (AVXVNNI, "avxvnni"), (AVX512, "avx512vnni"), ({"neon": True, "dotprod": True}, "neon")],
)  # fmt: skip
def test_the_best_tier_the_host_runs_is_picked(features: dict, best: str) -> None:
    assert tiers.pick_tier({}, features).name == best
    assert tiers.runnable_tiers(features)[-1].name == "portable"


def test_aarch64_features_come_from_the_kernels_hwcaps() -> None:
    """On AArch64 Linux LLVM's host features never name dotprod: the auxiliary vector's bits pick the tier
    (values as QEMU reports its CPU models; scripts/arm/neon_qemu.sh runs the neon tier's kernels)."""
    names = ("neon", "dotprod", "fullfp16", "i8mm")
    auxv = {
        "neoverse-n1": ({16: 0x119FFB, 26: 0}, (True, True, True, False)),
        "cortex-a72": ({16: 0x8FB, 26: 0}, (True, False, False, False)),
        "max": ({16: 0xECFFFFFB, 26: 0x7F877FFF}, (True, True, True, True)),
    }
    for cpu, (vector, have) in auxv.items():
        assert tiers.hwcap_features(vector.__getitem__) == dict(zip(names, have, strict=True)), cpu
    assert tiers.pick_tier({}, tiers.hwcap_features(auxv["neoverse-n1"][0].__getitem__)).name == "neon"
    assert tiers.pick_tier({}, tiers.hwcap_features(auxv["cortex-a72"][0].__getitem__)).name == "portable"
    neon = tiers.BY_NAME["neon"]
    assert neon.tiles is tiers.NEON_TILES and neon.fused_layer  # half conversions are base AArch64 (fcvt)


def test_numbas_target_on_aarch64_linux_has_the_hwcap_features() -> None:
    """LLVM aborts compiling sdot for a CPU it names "generic" without +dotprod: on AArch64 Linux Numba's
    features get the auxiliary vector's, unless NUMBA_CPU_FEATURES is set."""
    env: dict[str, str] = {}
    tiers.apply_numba_target(env, {"neon": True, "dotprod": True, "fullfp16": True, "i8mm": False})
    features = env["NUMBA_CPU_FEATURES"].split(",")
    assert {"+neon", "+dotprod", "+fullfp16", "-i8mm"} <= set(features)
    env = {"NUMBA_CPU_FEATURES": "+neon"}
    tiers.apply_numba_target(env, {"neon": True, "dotprod": True})
    assert env == {"NUMBA_CPU_FEATURES": "+neon"}
    env = {}
    tiers.apply_numba_target(env, {})  # not AArch64 Linux: the host's, as LLVM names them
    assert env == {}


def test_a_forced_tier_must_exist_and_run_on_the_host() -> None:
    assert tiers.pick_tier({"EDGELLM_CPU_TIER": "avx2"}, AVX512).name == "avx2"
    assert tiers.pick_tier({"EDGELLM_CPU_TIER": "portable"}, AVX512).name == "portable"
    with pytest.raises(tiers.CpuTierError, match=r"'avx3' is not a CPU tier; known: avx512vnni, avxvnni"):
        tiers.pick_tier({"EDGELLM_CPU_TIER": "avx3"}, AVX512)
    with pytest.raises(tiers.CpuTierError, match="EDGELLM_CPU_TIER=avxvnni: this CPU lacks avxvnni"):
        tiers.pick_tier({"EDGELLM_CPU_TIER": "avxvnni"}, X86)
    with pytest.raises(tiers.CpuTierError, match="lacks avx2, fma, f16c"):
        tiers.pick_tier({"EDGELLM_CPU_TIER": "avx2"}, {})
    # EDGELLM_NO_VNNI=1 is the portable tier, and contradicts any other
    assert tiers.pick_tier({"EDGELLM_NO_VNNI": "1"}, AVX512).name == "portable"
    assert tiers.pick_tier({"EDGELLM_NO_VNNI": "0"}, AVX512).name == "avx512vnni"
    with pytest.raises(tiers.CpuTierError, match="contradicts EDGELLM_CPU_TIER=avx2"):
        tiers.pick_tier({"EDGELLM_NO_VNNI": "1", "EDGELLM_CPU_TIER": "avx2"}, AVX512)


def test_a_process_started_with_a_tier_uses_it_or_says_why_not() -> None:
    code = (
        "from edgellm.backends.cpu import tiers; from edgellm.backends.cpu.backend import CpuBackend;"
        "print(CpuBackend().tier.name, [t.name for t in tiers.compiled_tiers()])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGELLM_")}

    def run(**extra: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-c", code]
        return subprocess.run(cmd, env={**env, **extra}, capture_output=True, text=True)

    ok = run(EDGELLM_CPU_TIER="portable")
    assert ok.returncode == 0 and ok.stdout.split() == ["portable", "[]"], ok.stderr
    best = tiers.runnable_tiers()[0]
    ok = run()
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split()[0] == best.name  # only the active tier's IR in the kernels
    bad = run(EDGELLM_CPU_TIER="avx3")
    assert bad.returncode != 0 and "CpuTierError: EDGELLM_CPU_TIER='avx3' is not a CPU tier" in bad.stderr
    absent = next((t for t in tiers.TIERS if tiers.missing_features(t)), None)
    if absent is not None:  # neon on x86, and the x86 tiers on ARM
        bad = run(EDGELLM_CPU_TIER=absent.name)
        assert bad.returncode != 0 and f"EDGELLM_CPU_TIER={absent.name}: this CPU lacks" in bad.stderr


def test_a_tier_outside_the_compiled_ones_is_refused() -> None:
    from edgellm.backends.cpu.backend import CpuBackend
    from edgellm.backends.cpu.matmul import tile_tier_index

    with pytest.raises(tiers.CpuTierError, match="not a CPU tier"):
        CpuBackend("avx3")
    compiled = tiers.compiled_tiers()
    for tier in tiers.TIERS:
        if tier.tiles is not None and tier not in compiled:
            with pytest.raises(tiers.CpuTierError, match=f"start it with EDGELLM_CPU_TIER={tier.name}"):
                CpuBackend(tier.name)
            with pytest.raises(tiers.CpuTierError, match=f"asked: {tier.name}"):
                tile_tier_index(tier.index)


# x86 tier -> (an LLVM CPU with exactly its instruction set, instructions its tile kernels must have,
# instructions they must not have)
# the weights' software prefetches go to L2 (prefetcht2) on every x86 tier (TileOps.prefetch_locality)
ASM = {
    "avx2": ("haswell", [r"vpmaddubsw\s.*%ymm", r"vpmaddwd\s.*%ymm", r"prefetcht2"], [r"vpdpbusd", r"%zmm"]),
    "avxvnni": ("alderlake", [r"\{vex\}\s+vpdpbusd\s.*%ymm", r"prefetcht2"], [r"%zmm", r"vpmaddubsw"]),
    "avx512vnni": ("icelake-server", [r"vpdpbusd\s.*%zmm", r"prefetcht2"], [r"vpmaddubsw"]),
}


def _asm(module: ir.Module, cpu: str) -> str:
    llb.initialize_all_targets()  # x86 on any host (an ARM one too)
    llb.initialize_all_asmprinters()
    target = llb.Target.from_triple(module.triple)
    parsed = llb.parse_assembly(str(module))
    parsed.verify()
    return target.create_target_machine(cpu=cpu, opt=2).emit_assembly(parsed)


@pytest.mark.parametrize("tier", list(ASM))
def test_tile_kernels_compile_to_the_tiers_instructions(tier: str) -> None:
    cpu, must, must_not = ASM[tier]
    module = ir.Module()
    module.triple = "x86_64-unknown-linux-gnu"
    # nibbles with a min (Q4_1), high bits (Q5_0), 6-bit with signed sub-scales (Q6_K), full bytes (Q8_0),
    # a table (IQ4_NL); 4 rows a block
    ops = tiers.BY_NAME[tier].tiles
    for qtype in (T.Q4_1, T.Q5_0, T.Q6_K, T.Q8_0, T.IQ4_NL):
        build_tile_kernel(module, qtype.name, TILE_LAYOUTS[qtype].key, 4, ops).linkage = ""
    silu_ir._build(module, "swiglu", ops).linkage = ""
    asm = _asm(module, cpu)
    for pattern in must:
        assert re.search(pattern, asm), f"{tier}: no {pattern}"
    for pattern in (*must_not, r"prefetcht0"):
        assert not re.search(pattern, asm), f"{tier}: {pattern} in the assembly"
    assert re.search(r"vpshufb\s.*%[yz]mm", asm)  # the table types' nibble lookup
    assert ("vscalefps" in asm) == (tier == "avx512vnni")


@pytest.mark.parametrize(("qtype", "words"), [(T.Q4_K, 8), (T.Q5_K, 4), (T.Q6_K, 2), (T.Q8_0, 1)])
def test_avx2_widens_the_int16_pair_sums_once_per_chunk_of_words(qtype: T, words: int) -> None:
    """AVX2's dot is vpmaddubsw then vpmaddwd: the kernels add the int16 pair sums of as many words as
    cannot overflow (8 of 4-bit weights, 4 of 5-bit, 2 of 6-bit; Q8_0's signed bytes: 1) and widen once."""
    module = ir.Module()
    module.triple = "x86_64-unknown-linux-gnu"
    build_tile_kernel(module, "k", TILE_LAYOUTS[qtype].key, 4, tiers.BY_NAME["avx2"].tiles).linkage = ""
    asm = _asm(module, "haswell")
    pairs, widen = (len(re.findall(rf"\t{op}\s", asm)) for op in ("vpmaddubsw", "vpmaddwd"))
    assert pairs > 0 and pairs == words * widen


def test_numba_target_of_a_lower_tier_turns_off_what_is_above_it() -> None:
    host = {**AVX512, "avx512dq": True, "amx-tile": True, "bmi2": True, "avxifma": True}
    env = tiers.numba_target_env(tiers.BY_NAME["avx2"], host)
    features = env["NUMBA_CPU_FEATURES"].split(",")
    assert env["NUMBA_CPU_NAME"] == "haswell"
    assert {"+avx2", "+fma", "+f16c", "+bmi2"} <= set(features)
    assert {"-avx512f", "-avx512vl", "-avx512dq", "-avxvnni", "-amx-tile", "-avxifma"} <= set(features)
    vnni = tiers.numba_target_env(tiers.BY_NAME["avxvnni"], host)["NUMBA_CPU_FEATURES"].split(",")
    assert "+avxvnni" in vnni and "-avx512f" in vnni and "-amx-tile" in vnni
    assert tiers.numba_target_env(tiers.BY_NAME["avx512vnni"], host) == {}


def test_neon_tile_kernels_compile_to_sdot_for_aarch64() -> None:
    """The NEON primitives (tiers.NEON_TILES: sdot, tbl for the tables) through the same kernel builders,
    compiled for an aarch64 CPU with dotprod (no ARM host needed)."""
    llb.initialize_all_targets()
    llb.initialize_all_asmprinters()
    module = ir.Module()
    module.triple = "aarch64-unknown-linux-gnu"
    for qtype in (T.Q4_1, T.Q6_K, T.Q8_0, T.IQ4_NL):
        build_tile_kernel(module, qtype.name, TILE_LAYOUTS[qtype].key, 4, tiers.NEON_TILES).linkage = ""
    silu_ir._build(module, "swiglu", tiers.NEON_TILES).linkage = ""
    parsed = llb.parse_assembly(str(module))
    parsed.verify()
    target = llb.Target.from_triple(module.triple)
    machine = target.create_target_machine(cpu="cortex-a76", features="+neon,+dotprod", opt=2)
    asm = machine.emit_assembly(parsed)
    assert re.search(r"\bsdot\s+v\d+\.4s, v\d+\.16b", asm)
    assert re.search(r"\btbl\s+v\d+\.16b", asm)
    assert not re.search(r"^\s+bl\s", asm, re.M)  # no library call: the fma and exp scaling are instructions


@pytest.mark.skipif(tiers.missing_features(tiers.BY_NAME["avx2"]), reason="host cannot run the avx2 tier")
def test_a_forced_tier_at_start_sets_numbas_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """EDGELLM_CPU_TIER=avx2 at process start: Numba compiles for haswell without AVX-512 (its cache keys
    entries on that target, so they never mix with the host's), and only the avx2 tier's IR is built. The
    target is set when Numba is first imported: the front-ends, imported before, load no llvmlite."""
    code = (
        "import sys, edgellm, edgellm.cli.commands, edgellm.server.app\n"
        "print(sorted(m for m in ('numba', 'llvmlite', 'edgellm.backends') if m in sys.modules))\n"
        "from numba.core.registry import cpu_target; from edgellm.backends.cpu import tiers\n"
        "print(cpu_target.target_context.codegen().magic_tuple(), [t.name for t in tiers.compiled_tiers()])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGELLM_", "NUMBA_CPU"))}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**env, "EDGELLM_CPU_TIER": "avx2"}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    front_end, numba_target = out.stdout.splitlines()
    assert front_end == "[]"
    assert "'haswell'" in numba_target and "-avx512f" in numba_target and numba_target.endswith("['avx2']")
    # every tier compiled under a target without AVX-512: the tiers needing it are left out
    monkeypatch.setenv("EDGELLM_CPU_ALL_TIERS", "1")
    avx2_target = tiers.numba_target_env(tiers.BY_NAME["avx2"])
    monkeypatch.setenv("NUMBA_CPU_FEATURES", avx2_target["NUMBA_CPU_FEATURES"])
    names = [t.name for t in tiers.compiled_tiers.__wrapped__()]
    assert "avx2" in names and "avx512vnni" not in names and "avxvnni" not in names
