"""Starting and watching the server for scripts/soak.py: a free loopback port, the launcher that sizes
the KV cache, /proc RSS readings, and the model's end-of-generation ids."""

from __future__ import annotations

import argparse
import ipaddress
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

# `serve` has no KV-size option: the launcher sets the default budget LLM() uses when given none
LAUNCHER = (
    "import sys, edgellm.llm; assert hasattr(edgellm.llm, 'DEFAULT_KV_MEMORY'), 'the KV default moved'; "
    "edgellm.llm.DEFAULT_KV_MEMORY = int(sys.argv[1]); "
    "from edgellm.server.__main__ import main; main(sys.argv[2:])"
)


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise SystemExit(f"refusing to soak {url}: only loopback addresses are allowed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def eog_ids(model: str) -> list[int]:
    from edgellm.catalog import resolve_model
    from edgellm.gguf.reader import load_gguf
    from edgellm.tokenizer import Tokenizer

    return sorted(Tokenizer.from_metadata(load_gguf(resolve_model(model, download=False)).metadata).eog_ids)


def start_server(a: argparse.Namespace, log_file: IO[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-c", LAUNCHER, str(a.kv_cache_bytes), a.model, "--port", str(port)]
    cmd += ["--ctx", str(a.ctx), "--max-num-seqs", str(a.max_num_seqs), "--max-queue", str(a.max_queue)]
    cmd += ["--threads", str(a.threads)]
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
