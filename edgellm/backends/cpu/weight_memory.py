"""Host memory for the weights the CPU backend prepares at load: huge pages or the kernel's 4 KiB ones.

numpy asks for transparent huge pages (madvise MADV_HUGEPAGE) on every array of 4 MiB or more, and
streaming weights from huge pages costs fewer TLB misses: decode is 4-7% faster than from 4 KiB pages
(docs/benchmarks.md, "Huge pages"). But on a virtual machine whose balloon device reports free memory to
the hypervisor (virtio-balloon free page reporting: the guest hands every free block of 2 MiB or more
back to the host), a huge page is such a block, and the first write to it may wait while the host backs
it again. How long depends on the host: on one such VM ~2.4 s per GiB against ~0.35 s with 4 KiB pages (a
5 GB model's weights then take seconds longer to prepare on huge pages), on another ~2 s per GiB with
either page size, where huge pages cost nothing at load and decode 20% faster. "auto" therefore keeps huge
pages unless free pages are reported, the weights are large enough for the difference to be seconds, and
a timed first write of a sample of each page size (first_touch_ratio, 0.04-0.11 s measured) finds huge
pages more than HUGE_TOUCH_RATIO_MAX times as slow; EngineConfig.huge_pages ("--huge-pages on|off")
overrides it.
"""

from __future__ import annotations

import mmap
import time
from pathlib import Path

import numpy as np

HUGE_PAGES_CHOICES = ("auto", "on", "off")
# "auto" gives up huge pages on a reporting VM from this many weight bytes: below it the extra first
# touch is well under a second (~2 s per GiB on one thread, the engine's threads share it).
AUTO_SMALL_PAGES_FROM_BYTES = 2 * 2**30
NUMPY_HUGE_PAGE_MIN_BYTES = 4 * 2**20  # numpy's threshold for its madvise
HUGE_PAGE_BYTES = 2 * 2**20
PAGE_BYTES = 4096
# first_touch_ratio's sample: PROBE_ROUNDS alternations of PROBE_BYTES of each page size (16 huge pages a
# round, a few tens of ms each at the slow hosts' rates)
PROBE_BYTES = 32 * 2**20
PROBE_ROUNDS = 2
# "auto" on a reporting VM keeps huge pages while their first write costs at most this many times the
# 4 KiB pages' (measured 0.2-2.3 where they cost nothing extra at load, ~7 where they cost seconds)
HUGE_TOUCH_RATIO_MAX = 3.0
VIRTIO_ID_BALLOON = 0x0005
VIRTIO_BALLOON_F_REPORTING = 5  # feature bit: free page reporting
VIRTIO_DEVICES = Path("/sys/bus/virtio/devices")


def free_page_reporting(devices: Path = VIRTIO_DEVICES) -> bool:
    """Whether a virtio balloon with free page reporting negotiated is present (Linux sysfs; the
    `features` file lists the negotiated feature bits as '0'/'1', bit 0 first). False where unreadable."""
    try:
        for dev in devices.iterdir():
            if int((dev / "device").read_text().strip(), 16) != VIRTIO_ID_BALLOON:
                continue
            bits = (dev / "features").read_text().strip()
            if len(bits) > VIRTIO_BALLOON_F_REPORTING and bits[VIRTIO_BALLOON_F_REPORTING] == "1":
                return True
    except (OSError, ValueError):
        return False
    return False


def anonymous_mapping(nbytes: int, huge: bool) -> mmap.mmap:
    """A private anonymous mapping of nbytes, advised MADV_HUGEPAGE or MADV_NOHUGEPAGE where the platform
    has that advice. A kernel built without transparent huge pages refuses both (EINVAL); its pages are
    all 4 KiB, so the mapping is what either advice would give (numpy's own madvise ignores it too)."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advice is not None:
        try:
            buf.madvise(advice)
        except OSError:
            pass
    return buf


def first_touch_seconds(nbytes: int, huge: bool) -> float:
    """Seconds to write one byte in every 4 KiB page of a fresh anonymous mapping of nbytes (rounded down
    to whole huge pages), advised MADV_HUGEPAGE or MADV_NOHUGEPAGE: what preparing weights on that page
    size waits for the memory. The mapping is unmapped before returning."""
    span = max(HUGE_PAGE_BYTES, nbytes // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES)
    buf = anonymous_mapping(span + HUGE_PAGE_BYTES, huge)
    try:
        whole = np.frombuffer(buf, np.uint8)
        start = -whole.ctypes.data % HUGE_PAGE_BYTES  # huge pages only back aligned 2 MiB blocks
        t0 = time.perf_counter()
        whole[start : start + span : PAGE_BYTES] = 1
        seconds = time.perf_counter() - t0
        del whole
    finally:
        buf.close()
    return seconds


def first_touch_ratio(nbytes: int = PROBE_BYTES, rounds: int = PROBE_ROUNDS) -> float:
    """How many times as long a first write to huge pages takes as to 4 KiB pages, over `rounds`
    alternations of nbytes of each (alternating, so a change in the host's state while it runs falls on
    both). 1.0 where the platform has no such advice."""
    if not (hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MADV_NOHUGEPAGE")):
        return 1.0
    huge = small = 0.0
    for _ in range(rounds):
        huge += first_touch_seconds(nbytes, True)
        small += first_touch_seconds(nbytes, False)
    return huge / max(small, 1e-9)


def use_huge_pages(
    setting: str, weight_bytes: int, reporting: bool | None = None, touch_ratio: float | None = None
) -> bool:
    """The page size decision for `weight_bytes` of prepared weights: "on", "off", or "auto" (huge
    pages unless free pages are reported to a hypervisor, the weights reach AUTO_SMALL_PAGES_FROM_BYTES
    and huge pages' first write costs more than HUGE_TOUCH_RATIO_MAX times the 4 KiB pages').
    `reporting`: free_page_reporting() when None; `touch_ratio`: first_touch_ratio() when None (measured
    only when the other conditions leave the decision to it)."""
    if setting not in HUGE_PAGES_CHOICES:
        raise ValueError(f"huge_pages must be one of {', '.join(HUGE_PAGES_CHOICES)}, not {setting!r}")
    if setting != "auto":
        return setting == "on"
    if weight_bytes < AUTO_SMALL_PAGES_FROM_BYTES:
        return True
    if not (free_page_reporting() if reporting is None else reporting):
        return True
    return (first_touch_ratio() if touch_ratio is None else touch_ratio) <= HUGE_TOUCH_RATIO_MAX


def weight_array(rows: int, width: int, huge_pages: bool) -> np.ndarray:
    """An uninitialised uint8 [rows, width] array for prepared weights. huge_pages: numpy's own
    allocation (huge pages from 4 MiB); else an anonymous mapping advised MADV_NOHUGEPAGE, so the
    kernel backs it with 4 KiB pages even where transparent huge pages are "always"."""
    n = rows * width
    if huge_pages or n < NUMPY_HUGE_PAGE_MIN_BYTES:
        return np.empty((rows, width), np.uint8)
    buf = anonymous_mapping(n, huge=False)
    return np.frombuffer(buf, np.uint8).reshape(rows, width)  # the array keeps the mapping alive
