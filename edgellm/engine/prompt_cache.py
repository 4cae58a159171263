"""A prompt cache beyond the KV pool (`--prompt-cache DIR [--prompt-cache-size 4G]`, EngineConfig
.prompt_cache): the KV blocks of finished prompts are kept in host RAM and spilled to DIR, so that a
prompt sharing a prefix with one computed before a restart (or before the model was unloaded) starts
from it instead of prefilling it again.

- What a block is keyed by: a chained SHA-256 of the full blocks of tokens up to it (`block_digests`)
  under a directory named by the model's identity (`identity`: the GGUF file's path, size and mtime, its
  architecture and KV shapes, the KV cache dtype and block size; the LoRA adapters a block was computed
  with, by file, chain its digest: `file_salt`). A file from
  another model lives under another identity, and each file repeats the identity and its digest in its
  header, so a foreign file is never read as this model's.
- Integrity: a file is MAGIC, the identity, the block digest, the payload's length and SHA-256, then the
  payload (every layer's K and V of the block, as the backend lays them out: Backend.read_kv_block). A
  truncated, corrupt or foreign file fails the check, is deleted and the block is recomputed.
- Bounds: RAM and disk each hold at most `size_bytes`, least recently used blocks going first.
- Off the step loop: the step thread only copies a finished prompt's blocks out of the pool (a memcpy,
  or a device-to-host copy); a writer thread writes the files. A write that fails (a full disk) is
  logged and forgotten.
- Restore (`restore_prefix`, the scheduler's `restore` hook): before a sequence is admitted, the
  blocks after its in-pool prefix hit that the cache has are written into free pool blocks and
  registered in the prefix cache, so the scheduler's ordinary prefix match takes them (`cached_tokens`
  counts them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from edgellm.engine.block_manager import BlockManager
    from edgellm.engine.model_runner import ModelRunner
    from edgellm.engine.sequence import Sequence as EngineSequence

log = logging.getLogger("edgellm.prompt_cache")

MAGIC = b"EDGEKV01"
_HEADER = len(MAGIC) + 32 + 32 + 8 + 32  # magic, identity, digest, payload length, payload SHA-256
DEFAULT_SIZE = 4 * 2**30


def block_digests(token_ids: Sequence[int], block_size: int, salt: tuple = ()) -> list[bytes]:
    """The chained SHA-256 of each full block of token_ids: block i's covers every token up to its end,
    and the LoRA choice the blocks were computed with (`salt`, as the pool's prefix cache keys them)."""
    out, parent = [], hashlib.sha256(repr(salt).encode()).digest() if salt else b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = np.asarray(token_ids[start : start + block_size], dtype="<i8").tobytes()
        parent = hashlib.sha256(parent + block).digest()
        out.append(parent)
    return out


def identity(model_path: str, fields: dict[str, Any]) -> bytes:
    """The model's identity for the cache: its file (real path, size, mtime) and `fields` (architecture,
    KV shapes and dtype, block size)."""
    st = os.stat(model_path)
    about = {"path": os.path.realpath(model_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, **fields}
    return hashlib.sha256(json.dumps(about, sort_keys=True, default=str).encode()).digest()


class PromptCache:
    def __init__(self, directory: str | Path, size_bytes: int, model_identity: bytes) -> None:
        if size_bytes <= 0:
            raise ValueError(f"prompt cache size must be > 0 bytes, got {size_bytes}")
        self.identity, self.size = model_identity, size_bytes
        self.dir = Path(directory) / model_identity.hex()[:32]
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._ram: OrderedDict[bytes, bytes] = OrderedDict()
        self._ram_bytes = 0
        self._disk: OrderedDict[bytes, int] = OrderedDict()  # digest -> file bytes, oldest first
        for p in self.dir.glob("*.tmp"):  # a write a killed process left half done
            p.unlink(missing_ok=True)
        files = []
        for p in self.dir.glob("*.kv"):
            try:
                files.append((p.stat().st_mtime_ns, bytes.fromhex(p.stem), p.stat().st_size))
            except (OSError, ValueError):
                continue
        for _, digest, size in sorted(files):
            self._disk[digest] = size
        self._disk_bytes = sum(self._disk.values())
        self._queue: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="edgellm-prompt-cache", daemon=True)
        self._writer.start()
        self.restored_blocks = self.rejected_files = self.write_errors = 0

    def _path(self, digest: bytes) -> Path:
        return self.dir / f"{digest.hex()}.kv"

    def __contains__(self, digest: bytes) -> bool:
        with self._lock:
            return digest in self._ram or digest in self._disk

    def get(self, digest: bytes) -> bytes | None:
        """The block's payload from RAM or disk (checked), or None."""
        with self._lock:
            payload = self._ram.get(digest)
            if payload is not None:
                self._ram.move_to_end(digest)
                return payload
            if digest not in self._disk:
                return None
        payload = self._read(digest)
        with self._lock:
            if payload is None:
                self._disk_bytes -= self._disk.pop(digest, 0)
            else:
                self._disk.move_to_end(digest)
                self._keep_in_ram(digest, payload)
        return payload

    def _read(self, digest: bytes) -> bytes | None:
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        payload = data[_HEADER:]
        n = int.from_bytes(data[len(MAGIC) + 64 : len(MAGIC) + 72], "little") if len(data) >= _HEADER else -1
        ok = (
            data[: len(MAGIC)] == MAGIC
            and data[len(MAGIC) : len(MAGIC) + 32] == self.identity
            and data[len(MAGIC) + 32 : len(MAGIC) + 64] == digest
            and n == len(payload)
            and data[len(MAGIC) + 72 : _HEADER] == hashlib.sha256(payload).digest()
        )
        if ok:
            try:
                os.utime(path)  # its place in the disk's LRU order after a restart (files sort by mtime)
            except OSError:
                pass
            return payload
        self.rejected_files += 1
        log.warning("prompt cache: %s failed its check (truncated, corrupt, foreign): recomputed", path.name)
        try:
            path.unlink()
        except OSError:
            pass
        return None

    def put(self, digest: bytes, payload: bytes) -> None:
        """Keep a block: in RAM now, on disk when the writer gets to it."""
        with self._lock:
            self._keep_in_ram(digest, payload)
        self._queue.put((digest, payload))

    def _keep_in_ram(self, digest: bytes, payload: bytes) -> None:
        if digest in self._ram:
            self._ram.move_to_end(digest)
            return
        self._ram[digest] = payload
        self._ram_bytes += len(payload)
        while self._ram_bytes > self.size and self._ram:
            _, old = self._ram.popitem(last=False)
            self._ram_bytes -= len(old)

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._write(*item)
            except Exception as e:  # noqa: BLE001 - a full disk, a removed directory: logged, never fatal
                self.write_errors += 1
                log.warning("prompt cache: could not write a block (%s); going on without it", e)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _write(self, digest: bytes, payload: bytes) -> None:
        with self._lock:
            if digest in self._disk:
                return
        header = MAGIC + self.identity + digest + len(payload).to_bytes(8, "little")
        data = header + hashlib.sha256(payload).digest() + payload
        path = self._path(digest)
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # a reader never sees a half-written file under the block's name
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:
            self._disk[digest] = len(data)
            self._disk_bytes += len(data)
            while self._disk_bytes > self.size and len(self._disk) > 1:
                old, n = self._disk.popitem(last=False)
                self._disk_bytes -= n
                self._path(old).unlink(missing_ok=True)

    def flush(self) -> None:
        """Wait until every block put so far is on disk (or failed)."""
        self._queue.join()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._writer.join(timeout=30)


def file_salt(runner: ModelRunner, salt: tuple) -> tuple:
    """A LoRA choice ((adapter index, scale), ...) as what it means beyond this process: each adapter's
    file (real path, size, mtime) and scale, since an index names another file after a restart."""
    out = []
    for k, scale in salt:
        path = os.path.realpath(runner.lora_adapters[k].path)
        st = os.stat(path)
        out.append((path, st.st_size, st.st_mtime_ns, scale))
    return tuple(out)


def restore_prefix(cache: PromptCache, bm: BlockManager, runner: ModelRunner, seq: EngineSequence) -> None:
    """The cache's blocks that continue a sequence's in-pool prefix hit, written into free pool blocks and
    registered in the prefix cache (as many as the pool has free blocks for: none is evicted for them)."""
    if bm.cache is None or not seq.samples or seq.num_computed_tokens or seq.media:
        return  # (a prompt with images: its blocks are keyed by the images too, which the files are not)
    first = len(bm.cache.lookup(seq.token_ids, seq.lora))
    payloads = []
    digests = block_digests(seq.token_ids, bm.block_size, file_salt(runner, seq.lora))
    for digest in digests[first:][: len(bm.free_list)]:
        payload = cache.get(digest)
        if payload is None:
            break
        payloads.append(payload)
    if not payloads:
        return
    blocks = bm.restore_blocks(seq.token_ids, first, len(payloads), seq.lora)
    for block, payload in zip(blocks, payloads, strict=True):
        runner.be.write_kv_block(runner.kv, block, payload)
    cache.restored_blocks += len(blocks)


def spill_prompt(
    cache: PromptCache, bm: BlockManager, runner: ModelRunner, prompt_ids: list[int], salt: tuple = ()
) -> None:
    """Copy a finished request's prompt blocks the cache lacks out of the pool (they are still there,
    cached under `salt`, its LoRA choice); the cache's writer thread puts them on disk."""
    if bm.cache is None:
        return
    blocks = bm.cache.lookup(prompt_ids, salt)
    digests = block_digests(prompt_ids, bm.block_size, file_salt(runner, salt))
    for block, digest in zip(blocks, digests, strict=False):
        if digest not in cache:
            cache.put(digest, runner.be.read_kv_block(runner.kv, block))
