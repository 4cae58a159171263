"""The CPU backend's kernel tiers: one per instruction set, the best the host can run picked at start.

Each tier names the host features it needs (llvmlite's get_host_cpu_features names) and the IR
primitives its kernels use (tier_ir.py). Every tier with tile primitives runs the same tile16 layouts at
the GGUF's bit width (tile_layouts.py) and the fused decoder layer, bit-identical to the portable kernels;
`portable` is the per-op Numba kernels over int8 rows, for any CPU.

EDGELLM_CPU_TIER=name forces a tier the host can run (a lower one on a bigger host, to test or measure
it); EDGELLM_NO_VNNI=1 means EDGELLM_CPU_TIER=portable. The kernels hold the IR of the tiers in
compiled_tiers(): the active one, or with EDGELLM_CPU_ALL_TIERS=1 every tier the host can run (the tests,
which run each of them in one process).
Numba compiles the generic vector code around the primitives for the host CPU. So that a forced lower
tier runs as it would on a CPU of that tier (for measuring it on a bigger host), with EDGELLM_CPU_TIER
set when edgellm is imported, the first import of Numba after it points Numba's target at that tier's
instruction set (edgellm/numba_target.py, numba_target_env; not where NUMBA_CPU_NAME is already set, nor
with EDGELLM_CPU_ALL_TIERS). That works only if Numba was not imported before edgellm, so set
EDGELLM_CPU_TIER when the process starts. This module imports no Numba.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llb

from edgellm.backends.cpu import tier_ir


class CpuTierError(ValueError):
    pass


@dataclass(frozen=True)
class TileOps:
    """The IR primitives of the tile kernels and the fused layer (see tier_ir)."""

    dot: Callable
    dot_max: int  # the largest unsigned weight byte `dot` is exact for
    shuffle: Callable
    scale2n: Callable
    signed_dot: Callable | None = None  # offset-128 byte layouts as signed bytes (see tier_ir)
    pair_dot: Callable | None = None  # dot in two steps, int16 pair sums first (see tier_ir)
    pair_widen: Callable | None = None
    # llvm.prefetch's locality for the streamed weights: 3 every level (x86 prefetcht0, ARM pldl1keep),
    # 1 the outer ones (x86 prefetcht2: into L2, where a core keeps more misses in flight than its L1's
    # fill buffers allow; docs/benchmarks.md "Prefetch into L2")
    prefetch_locality: int = 3


@dataclass(frozen=True)
class CpuTier:
    name: str
    needs: tuple[str, ...]  # host features (llvmlite names), all required
    tiles: TileOps | None  # None: the portable kernels
    numba_cpu: str  # LLVM CPU with this tier's instruction set, for a faithful Numba target ("": host)
    beyond: tuple[str, ...] = ()  # feature-name prefixes above this tier, off in that target
    index: int = 0  # position in TIERS: the kernels' tier argument

    @property
    def fused_layer(self) -> bool:
        """The whole decoder layer in one call (layer.py): tile primitives and half <-> float conversions
        as instructions (F16C on x86, in needs; base AArch64 fcvt on ARM)."""
        return self.tiles is not None and ("f16c" in self.needs or "neon" in self.needs)


_X86 = ("avx2", "fma", "f16c")
NEON_TILES = TileOps(
    tier_ir.signed_dot_neon, 127, tier_ir.shuffle_neon, tier_ir.scale2n_generic, tier_ir.signed_dot_neon
)
_AVX2_OPS = TileOps(
    tier_ir.dot_avx2,
    127,
    tier_ir.shuffle_avx2,
    tier_ir.scale2n_generic,
    tier_ir.signed_dot_avx2,
    tier_ir.pair_dot_avx2,
    tier_ir.pair_widen_avx2,
    prefetch_locality=1,
)
_TIERS = [
    CpuTier(
        "avx512vnni",
        (*_X86, "avx512f", "avx512bw", "avx512vnni"),
        TileOps(
            tier_ir.dot_avx512vnni, 255, tier_ir.shuffle_avx512, tier_ir.scale2n_avx512, prefetch_locality=1
        ),
        "",
    ),
    CpuTier(
        "avxvnni",
        (*_X86, "avxvnni"),
        TileOps(tier_ir.dot_avxvnni, 255, tier_ir.shuffle_avx2, tier_ir.scale2n_generic, prefetch_locality=1),
        "alderlake",
        ("avx512", "amx", "avx10"),
    ),
    CpuTier("avx2", _X86, _AVX2_OPS, "haswell", ("avx512", "amx", "avx10", "avxvnni", "avxifma", "avxne")),
    # run under emulation by scripts/arm/neon_qemu.sh; compile-checked for aarch64 in the default run
    CpuTier("neon", ("neon", "dotprod"), NEON_TILES, ""),
    CpuTier("portable", (), None, ""),
]
TIERS: tuple[CpuTier, ...] = tuple(
    CpuTier(t.name, t.needs, t.tiles, t.numba_cpu, t.beyond, i) for i, t in enumerate(_TIERS)
)  # best first
BY_NAME = {t.name: t for t in TIERS}


def by_name(name: str) -> CpuTier:
    tier = BY_NAME.get(name)
    if tier is None:
        raise CpuTierError(f"{name!r} is not a CPU tier; known: {', '.join(BY_NAME)}")
    return tier


# AArch64 Linux: LLVM's host features (from /proc/cpuinfo) name only a few extensions there (neon, crc,
# lse, sha, sve: never dotprod, fullfp16 or i8mm); the kernel reports them in the auxiliary vector
# (asm/hwcap.h bits), as user-mode QEMU does for the CPU it emulates.
_AT_HWCAP, _AT_HWCAP2 = 16, 26
AARCH64_HWCAPS = {
    "neon": (_AT_HWCAP, 1 << 1),  # HWCAP_ASIMD
    "dotprod": (_AT_HWCAP, 1 << 20),  # HWCAP_ASIMDDP
    "fullfp16": (_AT_HWCAP, 1 << 9),  # HWCAP_FPHP
    "i8mm": (_AT_HWCAP2, 1 << 13),  # HWCAP2_I8MM
}


def hwcap_features(getauxval: Callable[[int], int]) -> dict[str, bool]:
    return {name: bool(getauxval(at) & bit) for name, (at, bit) in AARCH64_HWCAPS.items()}


@cache
def _aarch64_linux_features() -> dict[str, bool]:
    if not sys.platform.startswith("linux") or platform.machine().lower() not in ("aarch64", "arm64"):
        return {}
    getauxval = ctypes.CDLL(None).getauxval
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return hwcap_features(getauxval)


def host_features() -> dict[str, bool]:
    return {**{k: bool(v) for k, v in llb.get_host_cpu_features().items()}, **_aarch64_linux_features()}


def missing_features(tier: CpuTier, features: dict[str, bool] | None = None) -> list[str]:
    have = host_features() if features is None else features
    return [f for f in tier.needs if not have.get(f)]


def runnable_tiers(features: dict[str, bool] | None = None) -> list[CpuTier]:
    """The tiers the host can run, best first (portable always)."""
    return [t for t in TIERS if not missing_features(t, features)]


def pick_tier(env: dict[str, str], features: dict[str, bool] | None = None) -> CpuTier:
    """The tier EDGELLM_CPU_TIER / EDGELLM_NO_VNNI ask for, else the best the host runs. CpuTierError
    naming the problem for an unknown name or one the host cannot run."""
    name = env.get("EDGELLM_CPU_TIER", "")
    if env.get("EDGELLM_NO_VNNI", "") not in ("", "0"):
        if name not in ("", "portable"):
            raise CpuTierError(f"EDGELLM_NO_VNNI=1 (portable) contradicts EDGELLM_CPU_TIER={name}")
        name = "portable"
    if not name:
        return runnable_tiers(features)[0]
    tier = BY_NAME.get(name)
    if tier is None:
        raise CpuTierError(f"EDGELLM_CPU_TIER={name!r} is not a CPU tier; known: {', '.join(BY_NAME)}")
    missing = missing_features(tier, features)
    if missing:
        raise CpuTierError(f"EDGELLM_CPU_TIER={name}: this CPU lacks {', '.join(missing)}")
    return tier


@cache
def active_tier() -> CpuTier:
    return pick_tier(dict(os.environ))


def _all_tiers_asked(env: dict[str, str]) -> bool:
    return env.get("EDGELLM_CPU_ALL_TIERS", "") not in ("", "0")


@cache
def compiled_tiers() -> tuple[CpuTier, ...]:
    """The tiers whose IR the kernels hold (a tier argument outside them is refused by check_compiled):
    never one needing a feature Numba's target turns off (NUMBA_CPU_FEATURES). Never raises: an invalid
    EDGELLM_CPU_TIER is reported by active_tier()."""
    if _all_tiers_asked(os.environ):
        off = {f[1:] for f in os.environ.get("NUMBA_CPU_FEATURES", "").split(",") if f.startswith("-")}
        return tuple(t for t in runnable_tiers() if t.tiles is not None and not off & set(t.needs))
    try:
        tier = active_tier()
    except CpuTierError:
        return ()
    return (tier,) if tier.tiles is not None else ()


def check_compiled(tier: CpuTier) -> CpuTier:
    """tier, if the kernels of this process can run it (else CpuTierError saying how to get it)."""
    if tier.tiles is not None and tier not in compiled_tiers():
        raise CpuTierError(
            f"CPU tier {tier.name} is not compiled into this process's kernels: start it with "
            f"EDGELLM_CPU_TIER={tier.name} (or EDGELLM_CPU_ALL_TIERS=1)"
        )
    if missing_features(tier):
        raise CpuTierError(f"CPU tier {tier.name}: this CPU lacks {', '.join(missing_features(tier))}")
    return tier


def numba_target_env(tier: CpuTier, features: dict[str, bool] | None = None) -> dict[str, str]:
    """NUMBA_CPU_NAME / NUMBA_CPU_FEATURES that make Numba compile for `tier`'s instruction set only (the
    host's features less those above the tier), or {} for the host's. They take effect only if set before
    Numba is imported; Numba's cache keys its entries on them, so code for different targets never mixes."""
    if not tier.numba_cpu:
        return {}
    have = host_features() if features is None else features
    on = [f for f, v in sorted(have.items()) if v and not f.startswith(tier.beyond)]
    off = [f for f, v in sorted(have.items()) if v and f.startswith(tier.beyond)]
    features = ",".join([f"+{f}" for f in on] + [f"-{f}" for f in off])
    return {"NUMBA_CPU_NAME": tier.numba_cpu, "NUMBA_CPU_FEATURES": features}


def apply_numba_target(env: dict[str, str], aarch64: dict[str, bool] | None = None) -> None:
    """Set (in env, normally os.environ) the Numba target of the tier EDGELLM_CPU_TIER forces, unless
    Numba's target is already set, all tiers are compiled, or the tier is unknown or beyond the host
    (the backend reports that). Called when Numba is first imported (edgellm/numba_target.py).
    On AArch64 Linux (aarch64: the auxiliary vector's features) Numba's host features are LLVM's, without
    dotprod: for a CPU LLVM names "generic" the neon tier's sdot could not be compiled (LLVM aborts),
    so NUMBA_CPU_FEATURES gets the host's features with them, unless it is set."""
    aarch64 = _aarch64_linux_features() if aarch64 is None else aarch64
    if aarch64 and "NUMBA_CPU_FEATURES" not in env:
        have = {**host_features(), **aarch64}
        env["NUMBA_CPU_FEATURES"] = ",".join(f"{'+' if v else '-'}{f}" for f, v in sorted(have.items()))
    if not env.get("EDGELLM_CPU_TIER") or "NUMBA_CPU_NAME" in env or _all_tiers_asked(env):
        return
    try:
        tier = pick_tier(env)
    except CpuTierError:
        return
    env.update(numba_target_env(tier))
