"""Write a self-derived draft model for speculative decoding: the target GGUF cut to its first N layers
(embedding, final norm and output matrix kept), so it has the target's vocabulary by construction.

    python scripts/make_layer_draft.py TARGET.gguf OUT.gguf --layers 8

No smaller model with SmolLM2's or Gemma 3's vocabulary ships on PyPI; this is what `--speculative draft:`
is benchmarked with (scripts/bench_speculative.py). Its drafts are only as good as the first layers' guess.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def write_layer_draft(src: str | Path, dst: str | Path, n_layers: int) -> Path:
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    count_key = f"{arch}.block_count"
    total = reader.fields[count_key].contents()
    if not 1 <= n_layers <= total:
        raise ValueError(f"--layers must be in 1..{total}, got {n_layers}")
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = n_layers if field.name == count_key else field.contents()
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    layer = re.compile(r"^blk\.(\d+)\.")
    kept = [t for t in reader.tensors if not (m := layer.match(t.name)) or int(m.group(1)) < n_layers]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
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
    ap.add_argument("--layers", type=int, required=True)
    a = ap.parse_args()
    from edgellm.catalog import resolve_model

    out = write_layer_draft(resolve_model(a.target), a.out, a.layers)
    print(f"{out} ({out.stat().st_size / 1e6:.0f} MB, {a.layers} layers)")


if __name__ == "__main__":
    main()
