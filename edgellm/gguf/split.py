"""Split GGUF models: every part of `NAME-00001-of-0000N.gguf`, joined into one `GGUFFile`.

llama.cpp's gguf-split (and gguf-py's GGUFWriter with split_max_tensors / split_max_size) writes a model as
N complete GGUF files, each with its own header, tensor table and data: the first holds all of the model's
metadata, every part holds `split.no` (0-based, u16), `split.count` (u16) and `split.tensors.count` (the
model's tensor count, i32), and the tensors are partitioned among the parts. llama.cpp's loader finds part
i as `PREFIX-%05d-of-%05d.gguf` next to the first and checks split.no, the total tensor count and that no
tensor appears twice; so do we, with errors naming the part. Each part is read and checked by the reader
as one file is (truncation, offsets, alignment) and stays memory-mapped; the joined model then goes
through the same config and validation as a single file.
"""

from __future__ import annotations

import re
from pathlib import Path

from edgellm.gguf.metadata import get_int
from edgellm.gguf.reader import GGUFError, GGUFFile, load_gguf_part

SPLIT_FILE_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
MAX_SPLIT_COUNT = 2**16 - 1  # split.count is a u16


def split_part_path(first: Path, no: int, count: int) -> Path:
    """Where part `no` (1-based) of `count` lies, as llama.cpp's llama_split_path names it."""
    m = SPLIT_FILE_NAME.match(first.name)
    if m is None:
        raise GGUFError(f"{first}: not a split model file name (expected NAME-00001-of-{count:05d}.gguf)")
    return first.with_name(f"{m['prefix']}-{no:05d}-of-{count:05d}.gguf")


def _split_keys(g: GGUFFile) -> tuple[int, int, int]:
    count = get_int(g, "split.count", 1, lo=1, hi=MAX_SPLIT_COUNT)
    no = get_int(g, "split.no", 0, lo=0, hi=MAX_SPLIT_COUNT)
    n_tensors = get_int(g, "split.tensors.count", len(g.tensors))
    return count, no, n_tensors


def join_split_parts(first: GGUFFile) -> GGUFFile:
    """The whole model from its first part (loaded by load_gguf_part): every other part loaded and
    checked against it, their tensors joined. A file whose split.count is 1 is returned as it is."""
    count, no, n_tensors = _split_keys(first)
    if no >= count:
        raise GGUFError(f"{first.path}: corrupt split metadata: split.no = {no}, split.count = {count}")
    if no != 0:
        raise GGUFError(
            f"{first.path}: this is part {no + 1} of a {count}-part split model (split.no = {no}); load the "
            f"first part, ...-00001-of-{count:05d}.gguf, which brings the others"
        )
    if count == 1:
        return first
    m = SPLIT_FILE_NAME.match(first.path.name)
    if m is None or int(m["no"]) != 1 or int(m["count"]) != count:
        raise GGUFError(
            f"{first.path}: the first part of a {count}-part split model (split.count = {count}), but its "
            f"name does not end in -00001-of-{count:05d}.gguf, so its other parts cannot be found"
        )
    parts, tensors = [first], dict(first.tensors)
    owner = dict.fromkeys(first.tensors, first.path)
    for i in range(1, count):
        path = split_part_path(first.path, i + 1, count)
        if not path.is_file():
            raise GGUFError(f"{first.path}: part {i + 1} of this {count}-part split model is missing: {path}")
        part = load_gguf_part(path)
        part_count, part_no, part_tensors = _split_keys(part)
        if (part_count, part_no, part_tensors) != (count, i, n_tensors):
            raise GGUFError(
                f"{path}: does not belong with {first.path.name}: its split.count / split.no / "
                f"split.tensors.count are {part_count} / {part_no} / {part_tensors}, expected {count} / {i} "
                f"/ {n_tensors}"
            )
        for name, info in part.tensors.items():
            if name in tensors:
                raise GGUFError(f"{path}: tensor {name!r} is also in {owner[name]} (a duplicated tensor)")
            tensors[name], owner[name] = info, path
        parts.append(part)
    if len(tensors) != n_tensors:
        raise GGUFError(
            f"{first.path}: split.tensors.count is {n_tensors}, but the {count} parts hold {len(tensors)} "
            "tensors"
        )
    return GGUFFile(
        path=first.path,
        version=first.version,
        metadata=first.metadata,
        tensors=tensors,
        file_size=sum(p.file_size for p in parts),
        _mmaps=tuple(mm for p in parts for mm in p._mmaps),
        parts=tuple(p.path for p in parts),
    )
