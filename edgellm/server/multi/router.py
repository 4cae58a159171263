"""Several models behind one port: `edgellm serve --models NAME[,NAME...]`.

Each model is served by its own `edgellm serve` child on a loopback port (its own engine core process, so
a crashed model leaves the others alone), as llama-swap and llama.cpp's router mode run one server per
model. The child starts on the model's first request (or POST /models/load) and stops after --keep-alive
idle seconds, or when --models-max models are loaded and another is asked for: the least recently used
model with no request in flight goes first (none idle: 503). The routes (every API the child serves,
relayed by the body's `model` field; the listings answered across models) are in server/multi/routes.py, and
server/multi/run.py starts the two on one port.
`--presets FILE` gives models flags of their own (read_presets).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from edgellm.config import API_KEY_ENV
from edgellm.sampling.defaults import SAMPLING_DEFAULT_FLAGS

try:  # the openai client's HTTP library: httpx, or httpx2 in recent openai releases
    import httpx
except ImportError:
    import httpx2 as httpx  # type: ignore[no-redef]

READY_LINE = "edgellm: serving"
# A presets file's per-model keys -> the flag of the model's `edgellm serve` they become.
PRESET_FLAGS = {
    "ctx": "--ctx",
    "threads": "--threads",
    "kv_cache_dtype": "--kv-cache-dtype",
    "kv_cache_memory": "--kv-cache-memory",
    "chat_template_file": "--chat-template-file",
    "max_queue": "--max-queue",
    # sampling defaults: temperature, top_p, top_k, min_p, repeat_penalty, presence_penalty, ...
    **{flag[2:].replace("-", "_"): flag for flag in SAMPLING_DEFAULT_FLAGS},
}


def read_presets(path: str, models: list[str]) -> dict[str, list[str]]:
    """`--presets FILE` (TOML): `[models."NAME"]` tables of PRESET_FLAGS keys -> each model's extra flags
    (after the command line's, so they win). A key or a model the router does not know is an error."""
    import tomllib

    with open(path, "rb") as f:
        data = tomllib.load(f)
    unknown_top = set(data) - {"models"}
    if unknown_top:
        raise ValueError(f'{path}: unknown table(s) {sorted(unknown_top)}; presets go in [models."NAME"]')
    out = {}
    for name, table in data.get("models", {}).items():
        if name not in models:
            raise ValueError(
                f"{path}: preset for {name!r}, which --models does not serve ({', '.join(models)})"
            )
        bad = set(table) - set(PRESET_FLAGS)
        if bad:
            raise ValueError(
                f"{path}: [models.{name!r}]: unsupported key(s) {sorted(bad)} "
                f"(known: {', '.join(PRESET_FLAGS)})"
            )
        out[name] = [f"{PRESET_FLAGS[k]}={v}" for k, v in table.items()]
    return out


@dataclass
class ModelSlot:
    name: str
    proc: subprocess.Popen | None = None
    url: str | None = None
    in_flight: int = 0
    last_used: float = 0.0
    tag_entry: dict[str, Any] | None = None  # its /api/tags entry, read from the file once

    @property
    def loaded(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ModelsBusyError(RuntimeError):
    """--models-max models are loaded and each has a request in flight: none can make room now."""


class ModelRouter:
    def __init__(
        self,
        models: list[str],
        keep_alive: float,
        models_max: int,
        child_args: list[str],
        presets: dict[str, list[str]] | None = None,
        api_key: str | None = None,
    ) -> None:
        if not models or models_max < 1 or keep_alive <= 0:
            raise ValueError("--models needs a name, --models-max >= 1 and --keep-alive > 0 seconds")
        self.slots = {name: ModelSlot(name) for name in models}
        self.keep_alive, self.models_max, self.child_args = keep_alive, models_max, child_args
        self.presets = presets or {}
        self.api_key = api_key
        self.client = httpx.AsyncClient(timeout=None)
        # Held while deciding which model to load and while loading it: two cold requests for different
        # models cannot both start one past --models-max; the second waits its turn.
        self.loading = asyncio.Lock()

    def _start_child(self, slot: ModelSlot) -> None:
        with socket.socket() as s:  # a free loopback port
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "edgellm", "serve", slot.name, "--port", str(port),
               "--served-model-name", slot.name, *self.child_args,
               *self.presets.get(slot.name, ())]  # fmt: skip
        # The key goes through the environment, never the command line (any local user reads that).
        env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
        if self.api_key is not None:
            env[API_KEY_ENV] = self.api_key
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines = []
        assert proc.stdout is not None
        while line := proc.stdout.readline():
            lines.append(line)
            if line.startswith(READY_LINE):
                threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
                slot.proc, slot.url = proc, f"http://127.0.0.1:{port}"
                return
        proc.wait()
        raise RuntimeError(f"model {slot.name} did not start:\n" + "".join(lines[-20:]))

    async def acquire(self, slot: ModelSlot) -> None:
        """Count a request in on `slot`, loading its model first if need be (its in-flight count keeps
        it from being unloaded meanwhile). Stopping and starting servers runs on threads: the event
        loop keeps answering while a model swaps."""
        slot.in_flight += 1
        slot.last_used = time.monotonic()
        try:
            if not slot.loaded:
                async with self.loading:
                    if not slot.loaded:
                        await self._make_room(slot)
                        await asyncio.to_thread(self._start_child, slot)
        except BaseException:
            slot.in_flight -= 1
            raise

    def release(self, slot: ModelSlot) -> None:
        slot.in_flight -= 1
        slot.last_used = time.monotonic()

    async def _make_room(self, wanted: ModelSlot) -> None:
        loaded = [s for s in self.slots.values() if s.loaded and s is not wanted]
        while len(loaded) >= self.models_max:
            idle = sorted((s for s in loaded if s.in_flight == 0), key=lambda s: s.last_used)
            if not idle:
                raise ModelsBusyError(f"{len(loaded)} models are loaded (--models-max) and all are busy")
            await self._unload_off_loop(idle[0])
            loaded.remove(idle[0])

    async def unload_idle(self, slot: ModelSlot) -> bool:
        """Unload `slot` unless a request is on it (or comes while waiting for the lock); False then."""
        async with self.loading:
            if slot.in_flight:
                return False
            await self._unload_off_loop(slot)
            return True

    def unload(self, slot: ModelSlot) -> None:
        _stop(_detach(slot))

    async def _unload_off_loop(self, slot: ModelSlot) -> None:
        """Unload `slot`: at once no request is sent to it (detached on the loop), its server is stopped
        on a thread (SIGINT, then SIGKILL after 30 s)."""
        await asyncio.to_thread(_stop, _detach(slot))

    async def reap_idle(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.keep_alive / 4))
            now = time.monotonic()
            for slot in self.slots.values():
                if slot.loaded and slot.in_flight == 0 and now - slot.last_used > self.keep_alive:
                    await self.unload_idle(slot)

    def close(self) -> None:
        for slot in self.slots.values():
            self.unload(slot)


def _detach(slot: ModelSlot) -> subprocess.Popen | None:
    proc, slot.proc, slot.url = slot.proc, None, None
    return proc


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
