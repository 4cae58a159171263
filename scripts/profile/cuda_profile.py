"""Launch overhead of the CUDA backend at batch-1 decode, fused and unfused: kernel launches per token (per
layer, outside the layers, by kernel), host transfers per token, decode wall time per token, and per-kernel
times. Greedy decoding with the argmax on the device, as the engine runs it.

    python scripts/profile/cuda_profile.py MODEL.gguf [--steps 16] [--prompt 32] [--json out.json]
    python scripts/profile/cuda_profile.py --synthetic smollm2  # SmolLM2's shapes and vocab, random weights
    NUMBA_ENABLE_CUDASIM=1 python scripts/profile/cuda_profile.py --synthetic tiny-smollm2 \
        --steps 1 --prompt 4

Per-kernel times (real GPU only; the simulator has no clock for them): "sync us" is the wall time with a
device synchronize before and after each launch (the launch's host cost + GPU time + sync latency), "gpu us"
the CUDA-event time (GPU execution only). Decode wall time minus the GPU time is what the host spends per
token (Python launch overhead, copies): the cost fusion removes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from edgellm.backends.cuda.config import SIMULATOR
from edgellm.testing.cuda.profile import Decoder, profile

SYNTHETIC = ("smollm2", "gemma3", "tiny-smollm2", "tiny-gemma3")


def synthetic_model(name: str) -> Path:
    """A real-shape synthetic model (edgellm/testing/real_shapes.py); "tiny-NAME": its simulator size."""
    from edgellm.testing.real_shapes import write_real_shape_model

    base = name.removeprefix("tiny-")
    return write_real_shape_model(base, Path(tempfile.mkdtemp()) / f"{name}.gguf", sim=base != name)


def report(name: str, dec: Decoder, res: dict[str, dict]) -> None:
    cfg = dec.cfg
    print(f"{name}: {cfg.arch}, {cfg.n_layers} layers, vocab {cfg.n_vocab}; batch-1 greedy decode")
    print(f"{'':34s}{'unfused':>12s}{'fused':>12s}")
    rows = [
        ("launches / token", "launches", "{:.0f}"),
        ("  per layer", "per_layer", "{:.1f}"),
        ("  outside the layers", "outside", "{:.0f}"),
        ("decode wall ms / token", "wall_ms", "{:.3f}"),
    ]
    for label, key, fmt in rows:
        print(f"{label:34s}" + "".join(f"{fmt.format(res[m][key]):>12s}" for m in ("unfused", "fused")))
    for label, key in (("to host / token (copies, bytes)", "to_host"), ("from host / token", "from_host")):
        cells = ("{:g}, {:g}".format(*res[m][key]) for m in ("unfused", "fused"))
        print(f"{label:34s}" + "".join(f"{c:>12s}" for c in cells))
    for m in ("unfused", "fused"):
        r = res[m]
        gpu_ms = sum(r["events"].values()) / 1e3
        tok_s = 1e3 / r["wall_ms"]
        line = f"{m}: {tok_s:.4g} tok/s wall"
        if gpu_ms > 0:
            per_launch = (r["wall_ms"] - gpu_ms) * 1e3 / r["launches"]
            line += f"; GPU busy {gpu_ms:.3f} ms/token; host time per launch ~{per_launch:.1f} us"
        print(line)
        print(f"  {'kernel':26s}{'launches':>9s}{'sync us':>14s}{'gpu us':>12s}   (per token)")
        for k, n in sorted(r["by_kernel"].items(), key=lambda kv: -r["sync"].get(kv[0], 0.0)):
            print(f"  {k:26s}{n:9.0f}{r['sync'].get(k, 0.0):14.1f}{r['events'].get(k, 0.0):12.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="a .gguf file")
    ap.add_argument("--synthetic", choices=SYNTHETIC, help="a synthetic model instead (real_shapes.py)")
    ap.add_argument("--steps", type=int, default=16, help="decode steps measured per mode")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens before decoding")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if not (args.model or args.synthetic):
        ap.error("give a model file or --synthetic NAME")
    path = Path(args.model) if args.model else synthetic_model(args.synthetic)
    dec = Decoder(path, args.prompt, args.steps)
    res = {m: profile(dec, m == "fused", args.steps) for m in ("unfused", "fused")}
    report(path.name + (" (simulator)" if SIMULATOR else ""), dec, res)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": path.name, **res}, indent=1))


if __name__ == "__main__":
    main()
