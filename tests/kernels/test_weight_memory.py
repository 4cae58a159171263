"""The prepared weights' page size: the decision (EngineConfig.huge_pages), the sysfs and first-write probes
behind "auto", and 4 KiB-page weights holding the same tiles as numpy's huge-page ones."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edgellm.backends.cpu import weight_memory as wm
from edgellm.backends.cpu.packed import pack_tiles
from edgellm.quants.traits import get_traits

BIG = wm.AUTO_SMALL_PAGES_FROM_BYTES


SLOW = wm.HUGE_TOUCH_RATIO_MAX * 3.5  # huge pages' first write as measured where it cost seconds


@pytest.mark.parametrize(
    ("setting", "weight_bytes", "reporting", "touch_ratio", "huge"),
    [
        ("on", BIG * 4, True, SLOW, True),
        ("off", 1, False, 1.0, False),
        ("auto", BIG, False, SLOW, True),  # no free page reporting: huge pages at any size
        ("auto", BIG, True, SLOW, False),  # reported free pages, big weights, slow huge pages: 4 KiB pages
        ("auto", BIG, True, wm.HUGE_TOUCH_RATIO_MAX, True),  # reported, but huge pages cost little more
        ("auto", BIG, True, 0.9, True),
        ("auto", BIG - 1, True, SLOW, True),  # reported, slow, but small: huge pages
    ],
)
def test_use_huge_pages_decides_from_setting_size_and_host(
    setting, weight_bytes, reporting, touch_ratio, huge
) -> None:
    assert wm.use_huge_pages(setting, weight_bytes, reporting=reporting, touch_ratio=touch_ratio) is huge


def test_auto_times_the_first_write_only_when_the_rest_leaves_it_open(monkeypatch) -> None:
    calls = []

    def ratio() -> float:
        calls.append(1)
        return SLOW

    monkeypatch.setattr(wm, "first_touch_ratio", ratio)
    assert wm.use_huge_pages("auto", BIG - 1, reporting=True)
    assert wm.use_huge_pages("auto", BIG, reporting=False)
    assert wm.use_huge_pages("on", BIG, reporting=True)
    assert not calls
    assert not wm.use_huge_pages("auto", BIG, reporting=True)
    assert calls == [1]


@pytest.mark.parametrize("huge", [True, False])
def test_first_touch_seconds_writes_a_fresh_mapping_and_unmaps_it(huge: bool) -> None:
    def anonymous_kb() -> int:  # the process's anonymous memory in mappings (/proc/self/status RssAnon)
        line = next(s for s in Path("/proc/self/status").read_text().splitlines() if s.startswith("RssAnon"))
        return int(line.split()[1])

    size = 8 * wm.HUGE_PAGE_BYTES
    before = anonymous_kb()
    seconds = wm.first_touch_seconds(size, huge)
    assert 0 < seconds < 5
    assert anonymous_kb() - before < size // 1024 // 2  # the written pages are gone with the mapping


def test_first_touch_ratio_is_a_positive_finite_ratio() -> None:
    r = wm.first_touch_ratio(wm.HUGE_PAGE_BYTES * 2, rounds=1)
    assert 0 < r < float("inf")


class _RefusingMapping(mmap.mmap):
    """A mapping whose madvise fails as on a kernel without transparent huge pages."""

    def madvise(self, *args: int) -> None:
        raise OSError(22, "Invalid argument")


def test_a_kernel_refusing_the_page_advice_still_gets_its_weights_and_a_decision(monkeypatch) -> None:
    monkeypatch.setattr(wm.mmap, "mmap", _RefusingMapping)
    a = wm.weight_array(3, wm.NUMPY_HUGE_PAGE_MIN_BYTES, huge_pages=False)  # --huge-pages off
    a[:] = 7
    assert a.shape == (3, wm.NUMPY_HUGE_PAGE_MIN_BYTES) and int(a.sum()) == 7 * a.size
    assert 0 < wm.first_touch_seconds(wm.HUGE_PAGE_BYTES, True) < 5
    assert wm.use_huge_pages("auto", BIG, reporting=True)  # both samples on 4 KiB pages: no reason to give up


def test_an_unknown_huge_pages_setting_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="'yes'"):
        wm.use_huge_pages("yes", 1)


def _virtio(root: Path, name: str, device: int, features: str) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "device").write_text(f"0x{device:04x}\n")
    (d / "features").write_text(features + "\n")


def test_free_page_reporting_reads_the_balloons_negotiated_feature_bit(tmp_path: Path) -> None:
    bits = ["0"] * 64
    assert not wm.free_page_reporting(tmp_path / "absent")
    _virtio(tmp_path, "virtio0", 0x0002, "".join(bits[:5] + ["1"] + bits[6:]))  # a disk: bit 5 is not ours
    assert not wm.free_page_reporting(tmp_path)
    _virtio(tmp_path, "virtio1", wm.VIRTIO_ID_BALLOON, "".join(bits[:2] + ["1"] + bits[3:]))  # no reporting
    assert not wm.free_page_reporting(tmp_path)
    _virtio(tmp_path, "virtio2", wm.VIRTIO_ID_BALLOON, "".join(bits[:5] + ["1"] + bits[6:]))
    assert wm.free_page_reporting(tmp_path)


def _vm_flags(a: np.ndarray) -> set[str]:
    """The VmFlags of the mapping holding a's first byte (/proc/self/smaps)."""
    addr, inside = a.ctypes.data, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_tiles_on_small_pages_are_the_tiles_on_huge_pages_and_their_mapping_refuses_huge_pages() -> None:
    cols, rows = 2048, 4096  # the lo plane: rows * cols / 2 = 4 MiB, past numpy's huge page threshold
    raw = np.random.default_rng(0).integers(0, 256, (rows, get_traits(T.Q4_K).row_bytes(cols)), np.uint8)
    huge = pack_tiles(T.Q4_K, [raw], cols, "w", huge_pages=True)
    small = pack_tiles(T.Q4_K, [raw], cols, "w", huge_pages=False)
    for p, q in zip(huge.tiles.planes, small.tiles.planes, strict=True):
        np.testing.assert_array_equal(p, q)
    lo = small.tiles.planes[0]
    assert lo.nbytes >= wm.NUMPY_HUGE_PAGE_MIN_BYTES and lo.flags.writeable
    assert "nh" in _vm_flags(lo)  # MADV_NOHUGEPAGE: 4 KiB pages even with THP "always"
    assert "nh" not in _vm_flags(huge.tiles.planes[0])


def test_the_engine_prepares_weights_on_the_pages_its_config_names(tmp_path: Path) -> None:
    """EngineConfig.huge_pages (--huge-pages) reaches the backend before the model loads, and the
    engine reports it; the page size changes no logit."""
    import argparse

    from edgellm.engine.config import EngineConfig
    from edgellm.engine.core_process import EngineCoreProc
    from edgellm.testing.synthetic.models import write_tiny_model

    path = write_tiny_model(tmp_path / "m.gguf", "llama", "Q8_0", n_layers=1)
    spec = {"n_ctx": 32, "kv_cache_memory": 1 << 20, "threads": 1}
    cores = {hp: EngineCoreProc(EngineConfig(str(path), huge_pages=hp, **spec)) for hp in ("on", "off")}
    pages = [(c.backend.huge_pages, c.info["huge_pages"]) for c in cores.values()]
    assert pages == [(True, True), (False, False)]
    ids = [1, 5, 9, 2, 7]
    np.testing.assert_array_equal(cores["on"].score(ids), cores["off"].score(ids))
    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    assert parser.parse_args(["--huge-pages", "off"]).huge_pages == "off"
    assert parser.parse_args([]).huge_pages == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--huge-pages", "yes"])
