"""Starting and watching the server for scripts/soak.py: a free loopback port, the server's command
line, /proc RSS readings (the server and its engine core), and the model's end-of-generation ids."""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

from soak_traffic import httpx

ROOT = Path(__file__).resolve().parent.parent



def check_loopback(url: str) -> None:
    from edgellm.server import _is_loopback  # the server's own test of its --host

    if not _is_loopback(urlparse(url).hostname or ""):
        raise SystemExit(f"refusing to soak {url}: only loopback addresses are allowed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    from edgellm.catalog import resolve_model
    from edgellm.gguf.load import load_gguf
    from edgellm.tokenizer import Tokenizer

    return sorted(Tokenizer.from_metadata(load_gguf(resolve_model(model, download=False)).metadata).eog_ids)


def start_server(a: argparse.Namespace, log_file: IO[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "edgellm.server", a.model, "--port", str(port)]
    cmd += ["--kv-cache-memory", str(a.kv_cache_bytes)]
    cmd += ["--ctx", str(a.ctx), "--max-num-seqs", str(a.max_num_seqs), "--max-queue", str(a.max_queue)]
    cmd += ["--threads", str(a.threads), "--api-key", a.api_key]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + a.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see {log_file.name}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise SystemExit(f"the server did not become healthy in {a.start_timeout} s; see {log_file.name}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
