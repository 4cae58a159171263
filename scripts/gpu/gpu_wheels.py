"""Fill the git-ignored wheel folder that scripts/gpu/gpu_check.sh installs from on a machine with no network.

The lent GPU machine (Python 3.12; numpy, numba, numba-cuda, cuda-core, pyyaml, requests, tqdm, sentencepiece,
pytest already there: /work/.library/device/KINDS.md) lacks only gguf among what the check imports.

    python scripts/gpu/gpu_wheels.py            # pip download --no-deps of NEEDED for CPython 3.12 x86-64
    python scripts/gpu/gpu_wheels.py --repack   # offline: wheels rebuilt from this machine's installed copies

Then carry the folder: run(command="bash scripts/gpu/gpu_check.sh", carry=[".gpu_wheels"], ...).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

NEEDED = ("gguf",)  # pure-Python: the version installed here, so both machines read GGUFs alike
DEFAULT_DIR = Path(__file__).resolve().parents[2] / ".gpu_wheels"


def download(name: str, dest: Path) -> None:
    version = metadata.version(name)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
           "--platform", "any", "-d", str(dest), f"{name}=={version}"]  # fmt: skip
    subprocess.run(cmd, check=True)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(name: str, dest: Path) -> Path:
    """A pure-Python wheel of the installed distribution `name`: its files and dist-info, a fresh RECORD."""
    dist = metadata.distribution(name)
    tag = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}"
    path = dest / f"{tag}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in dist.files or []:
            parts = f.parts
            if "__pycache__" in parts or parts[0].startswith("..") or f.name in ("RECORD", "INSTALLER"):
                continue
            if parts[0].endswith(".dist-info") and parts[0] != f"{tag}.dist-info":
                continue
            src = Path(dist.locate_file(f))
            if not src.is_file():
                continue
            data = src.read_bytes()
            zf.writestr(f.as_posix(), data)
            records.append(f"{f.as_posix()},{_record_hash(data)},{len(data)}")
        records.append(f"{tag}.dist-info/RECORD,,")
        zf.writestr(f"{tag}.dist-info/RECORD", "\n".join(records) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--repack", action="store_true", help="rebuild from the installed copies (no network)")
    args = ap.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    for name in NEEDED:
        if args.repack:
            print(repack(name, args.dest))
        else:
            download(name, args.dest)
    print(f"{args.dest}: {sorted(p.name for p in args.dest.glob('*.whl'))}")


if __name__ == "__main__":
    main()
