"""Starting and watching the server for scripts/soak/soak.py: the server's command line (started and waited
for by edgellm/testing/servers.py, the one launcher), /proc RSS readings (the server and its engine core),
and the model's end-of-generation ids."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

from edgellm.testing import servers


def check_loopback(url: str) -> None:
    from edgellm.server import _is_loopback  # the server's own test of its --host

    if not _is_loopback(urlparse(url).hostname or ""):
        raise SystemExit(f"refusing to soak {url}: only loopback addresses are allowed")


def _own_rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the field after the state is the parent's pid
            kids.append(int(stat.parent.name))
    return kids


def read_rss_kb(pid: int) -> int | None:
    """RSS of the server and its descendants (the engine core is a child process of the server)."""
    own = _own_rss_kb(pid)
    if own is None:
        return None
    return own + sum(read_rss_kb(k) or 0 for k in _children(pid))


def eog_ids(model: str) -> list[int]:
    from edgellm.gguf.load import load_gguf
    from edgellm.models.catalog import resolve_model
    from edgellm.tokenizer import Tokenizer

    return sorted(Tokenizer.from_metadata(load_gguf(resolve_model(model, download=False)).metadata).eog_ids)


def start_server(a: argparse.Namespace, log_file: IO[str]) -> tuple[subprocess.Popen, str]:
    args = [a.model, "--kv-cache-memory", str(a.kv_cache_bytes)]
    args += ["--ctx", str(a.ctx), "--max-num-seqs", str(a.max_num_seqs), "--max-queue", str(a.max_queue)]
    args += ["--threads", str(a.threads), "--api-key", a.api_key]
    proc, url = servers.spawn(args, entry=servers.SERVER_MODULE, stdout=log_file)
    try:
        servers.wait_healthy(proc, url, a.start_timeout, poll=0.2)
    except servers.ServerStartError as e:
        stop_server(proc)
        raise SystemExit(f"{e}; see {log_file.name}") from None
    return proc, url


def stop_server(proc: subprocess.Popen) -> None:
    servers.stop_server(proc, timeout=20, check=False)
