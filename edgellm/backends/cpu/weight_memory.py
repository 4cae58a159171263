"""Host memory for the weights the CPU backend prepares at load: huge pages or the kernel's 4 KiB ones.

numpy asks for transparent huge pages (madvise MADV_HUGEPAGE) on every array of 4 MiB or more, and
streaming weights from huge pages costs fewer TLB misses: decode is 4-7% faster than from 4 KiB pages
(docs/benchmarks.md, "Huge pages"). But on a virtual machine whose balloon device reports free memory to
the hypervisor (virtio-balloon free page reporting: the guest hands every free block of 2 MiB or more
back to the host), a huge page is such a block, and the first write to it waits while the host backs it
again: ~2.4 s per GiB, against ~0.35 s with 4 KiB pages, which come from fragments the guest keeps.
There a 5 GB model's weights take seconds longer to prepare on huge pages. "auto" therefore prepares
on 4 KiB pages only where free pages are reported and the weights are large enough for that to be
seconds; EngineConfig.huge_pages ("--huge-pages on|off") overrides it.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

HUGE_PAGES_CHOICES = ("auto", "on", "off")
# "auto" gives up huge pages on a reporting VM from this many weight bytes: below it the extra first
# touch is well under a second (~2 s per GiB on one thread, the engine's threads share it).
AUTO_SMALL_PAGES_FROM_BYTES = 2 * 2**30
NUMPY_HUGE_PAGE_MIN_BYTES = 4 * 2**20  # numpy's threshold for its madvise
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


def use_huge_pages(setting: str, weight_bytes: int, reporting: bool | None = None) -> bool:
    """The page size decision for `weight_bytes` of prepared weights: "on", "off", or "auto" (huge
    pages unless free pages are reported to a hypervisor and the weights reach
    AUTO_SMALL_PAGES_FROM_BYTES). `reporting`: free_page_reporting() when None."""
    if setting not in HUGE_PAGES_CHOICES:
        raise ValueError(f"huge_pages must be one of {', '.join(HUGE_PAGES_CHOICES)}, not {setting!r}")
    if setting != "auto":
        return setting == "on"
    if weight_bytes < AUTO_SMALL_PAGES_FROM_BYTES:
        return True
    return not (free_page_reporting() if reporting is None else reporting)


def weight_array(rows: int, width: int, huge_pages: bool) -> np.ndarray:
    """An uninitialised uint8 [rows, width] array for prepared weights. huge_pages: numpy's own
    allocation (huge pages from 4 MiB); else an anonymous mapping advised MADV_NOHUGEPAGE, so the
    kernel backs it with 4 KiB pages even where transparent huge pages are "always"."""
    n = rows * width
    if huge_pages or n < NUMPY_HUGE_PAGE_MIN_BYTES:
        return np.empty((rows, width), np.uint8)
    buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, np.uint8).reshape(rows, width)  # the array keeps the mapping alive
