#!/usr/bin/env bash
# Opt-in (not in the default test run): the neon tier's kernel tests on an emulated aarch64 CPU, for
# developers without an ARM machine. User-mode QEMU runs a Debian arm64 Python with PyPI's aarch64 wheels
# of the host's numpy/numba/llvmlite/gguf; the tests compare the neon tier's tile kernels, SwiGLU and
# fused layer with the portable kernels in one process (EDGELLM_CPU_ALL_TIERS=1, as tests/conftest.py
# sets). Setup is idempotent (Debian packages and wheels are fetched once into ARM64_ROOT).
#
#   scripts/arm/neon_qemu.sh                      # the kernel tests below
#   scripts/arm/neon_qemu.sh -k swiglu            # extra pytest arguments
#   TESTS="tests/kernels/test_cpu_tiers.py" scripts/arm/neon_qemu.sh
#
# ARM64_ROOT (default ~/.cache/edgellm/arm64): the arm64 root. QEMU_CPU (default neoverse-n1: ARMv8.2 with
# dotprod and fp16, no i8mm or SVE): the emulated CPU, also Numba's target (NUMBA_CPU_NAME), since under
# user-mode QEMU LLVM reads the host's /proc/cpuinfo and names the CPU "generic"; QEMU_CPU=max (every
# extension QEMU has) compiles for "generic", with the features the auxiliary vector reports, as on an
# ARM CPU LLVM does not know. Emulation is slow (docs/benchmarks.md has the figures); one process, nice 10.
# Needs root for apt-get/debootstrap the first time (or qemu-user-static and debootstrap installed).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=${ARM64_ROOT:-$HOME/.cache/edgellm/arm64}
CPU=${QEMU_CPU:-neoverse-n1}
NUMBA_CPU=$CPU
[ "$CPU" = max ] && NUMBA_CPU=generic  # not an LLVM CPU name
SUITE=bookworm  # Python 3.11, as pyproject's requires-python
TESTS=${TESTS:-tests/kernels/test_cpu_tiers.py tests/kernels/test_vnni_kernels.py
tests/kernels/test_cpu_elementwise.py tests/kernels/test_backend_ops.py tests/kernels/test_fused_layer.py}
SITE=$ROOT/opt/edgellm-site
PY=$ROOT/usr/bin/python3.11

if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
    apt-get install -y qemu-user-static debootstrap
fi

# 1. An arm64 root with Python. debootstrap's second stage runs arm64 programs through binfmt_misc, which
# a container may not register; Python needs none of the packages' scripts, so the first stage's
# downloads are unpacked instead.
if [ ! -x "$PY" ]; then
    debootstrap --arch=arm64 --foreign --variant=minbase --include=python3 "$SUITE" "$ROOT" \
        http://deb.debian.org/debian
    for deb in "$ROOT"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
fi

# 2. PyPI's aarch64 wheels of the versions this host runs, unpacked by the host's pip (no emulation).
versions=$(cd "$REPO" && python3 -c '
import importlib.metadata as m
print(" ".join(f"{p}=={m.version(p)}" for p in ("numpy", "numba", "llvmlite", "gguf", "pytest")))')
if [ "$(cat "$SITE/.versions" 2>/dev/null)" != "$versions" ]; then
    rm -rf "$SITE"
    # shellcheck disable=SC2086  # $versions is a list of requirements
    python3 -m pip install --quiet --target "$SITE" --only-binary=:all: --python-version 3.11 \
        --implementation cp --abi cp311 --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_27_aarch64 --platform manylinux2014_aarch64 $versions pyyaml
    echo "$versions" >"$SITE/.versions"
fi

# 3. The tests spawn sys.executable; without binfmt_misc an arm64 program cannot exec another, so the
# emulated Python names as its executable a host script that starts it under QEMU again (beside the
# real one, where Python finds its standard library from it).
WRAP=$ROOT/usr/bin/python3-qemu
cat >"$WRAP" <<WRAPPER
#!/bin/sh
exec qemu-aarch64-static -L "$ROOT" -cpu "\${QEMU_CPU:-$CPU}" -0 "\$0" "$PY" "\$@"
WRAPPER
chmod +x "$WRAP"

cd "$REPO"
echo "qemu: $(qemu-aarch64-static --version | head -1); cpu $CPU; $versions"
# --noconftest: tests/conftest.py imports the whole app (tui, catalog) for the model fixtures these
# tests do not use; it only sets EDGELLM_CPU_ALL_TIERS, set here.
# shellcheck disable=SC2086  # $TESTS is a list of paths
time env -u NUMBA_CPU_FEATURES PYTHONPATH="$REPO:$SITE" QEMU_CPU="$CPU" NUMBA_CPU_NAME="$NUMBA_CPU" \
    NUMBA_CACHE_DIR="$ROOT/numba-cache" EDGELLM_CPU_TIER=neon EDGELLM_CPU_ALL_TIERS=1 \
    nice -n 10 "$WRAP" -m pytest -p no:cacheprovider --noconftest -q $TESTS "$@"
