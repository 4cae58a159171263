"""Write a self-derived draft model for speculative decoding: the target GGUF cut to some of its layers
(embedding, final norm and output matrix kept), so it has the target's vocabulary by construction.

    python scripts/make_layer_draft.py TARGET.gguf OUT.gguf --layers 8          # the first 8 layers
    python scripts/make_layer_draft.py TARGET.gguf OUT.gguf --layers 0-3,26-29  # first and last 4

No smaller model with SmolLM2's or Gemma 3's vocabulary ships on PyPI; this is what `--speculative draft:`
is benchmarked with (scripts/bench_speculative.py, scripts/spec_costs.py). Its drafts are only as good as
those layers' guess: the first layers alone predict almost nothing (their output is not yet in the output
matrix's space); keeping the last layers too (layer skipping, as in self-speculative decoding) does better.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_layers(spec: str, total: int) -> list[int]:
    """ "N" (the first N layers) or ranges and indices ("0-3,26-29"), ascending, each in 0..total-1."""
    if spec.isdigit():
        n = int(spec)
        if not 1 <= n <= total:
            raise ValueError(f"--layers must be in 1..{total}, got {n}")
        return list(range(n))
    layers: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--layers: {part!r} is not a layer index or a range A-B")
        layers += range(int(lo), int(hi or lo) + 1)
    if not layers or layers != sorted(set(layers)) or layers[-1] >= total:
        raise ValueError(f"--layers {spec!r}: distinct ascending layers in 0..{total - 1} needed")
    return layers


def write_layer_draft(src: str | Path, dst: str | Path, layers: str) -> Path:
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    count_key = f"{arch}.block_count"
    keep = parse_layers(layers, reader.fields[count_key].contents())
    new_index = {old: new for new, old in enumerate(keep)}  # target layer -> draft layer
    n_layers = len(keep)
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = n_layers if field.name == count_key else field.contents()
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    layer = re.compile(r"^blk\.(\d+)\.")
    kept, names = [], []
    for t in reader.tensors:
        m = layer.match(t.name)
        if m is None:
            kept.append(t)
            names.append(t.name)
        elif int(m.group(1)) in new_index:
            kept.append(t)
            names.append(f"blk.{new_index[int(m.group(1))]}.{t.name[m.end() :]}")
    for t, name in zip(kept, names, strict=True):
        writer.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return Path(dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", help="catalog name or .gguf path")
    ap.add_argument("out")
    ap.add_argument("--layers", required=True, help='N (the first N) or indices and ranges, e.g. "0-3,26-29"')
    a = ap.parse_args()
    from edgellm.catalog import resolve_model

    out = write_layer_draft(resolve_model(a.target), a.out, a.layers)
    print(f"{out} ({out.stat().st_size / 1e6:.0f} MB, layers {a.layers})")


if __name__ == "__main__":
    main()
