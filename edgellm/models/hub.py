"""Models from the Hugging Face Hub, named the ways llama.cpp and Ollama taught users to name them.

`hf://ORG/REPO[:QUANT]`, `hf.co/ORG/REPO[:QUANT]`, `ORG/REPO:QUANT`, or a file's URL
(`https://huggingface.co/ORG/REPO/resolve/REV/FILE.gguf`, or the same under HF_ENDPOINT). The file is
chosen as llama.cpp's `-hf` chooses it (common/download.cpp, find_best_model): the first `.gguf` (not an
mmproj or imatrix file) whose path contains the tag followed by `.` or `-`, case-insensitive; without a
tag Q4_K_M, then Q8_0, then the first model file; of a split model the first part, then every part.

The transfer is huggingface_hub's (`hf_hub_download`): its cache layout (shared with llama.cpp and
transformers: HF_HUB_CACHE / HF_HOME; under EDGELLM_MODELS_DIR/huggingface when that is set), resumption
of a broken transfer, HF_TOKEN, HF_ENDPOINT, and the size check. On top, each downloaded file's sha256 is
checked against the LFS sha256 the hub lists, and a file that does not match is deleted.

The hub is contacted only for a name in one of these forms. A model argument already in the cache is
used without contacting it (as `ollama run` does); `edgellm pull` asks the hub for the newest revision
(a file already there is not transferred again). HF_HUB_OFFLINE=1: the cache only.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from edgellm.gguf.split import SPLIT_FILE_NAME
from edgellm.models.files import ModelNotFoundError, file_sha256

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's -hf without a tag
DEFAULT_ENDPOINT = "https://huggingface.co"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO = re.compile(rf"(?P<repo>{_NAME}/{_NAME})")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
HUB_PREFIXES = ("hf://", "hf.co/", "huggingface.co/")
Progress = Callable[[str, int, int | None], None]  # (file, bytes so far, total bytes)


class HubError(ModelNotFoundError):
    """A hub model that cannot be had; the message names the model and the reason."""


class ChecksumError(HubError):
    pass


@dataclass(frozen=True)
class HubRef:
    repo: str  # ORG/REPO
    quant: str | None = None  # the tag to choose a file by (None: llama.cpp's default choice)
    filename: str | None = None  # a file named exactly (from a URL)
    revision: str = "main"

    def __str__(self) -> str:
        if self.filename:
            return f"hf://{self.repo}/{self.filename}"
        return f"hf://{self.repo}" + (f":{self.quant}" if self.quant else "")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def cache_dir() -> Path:
    """huggingface_hub's cache (HF_HUB_CACHE), or EDGELLM_MODELS_DIR/huggingface when that is set."""
    mine = os.environ.get("EDGELLM_MODELS_DIR")
    if mine:
        return Path(mine) / "huggingface"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def parse_hub_ref(text: str) -> HubRef | None:
    """The hub model `text` names, None if it names none; ValueError for a hub name that is malformed."""
    if text.startswith(("https://", "http://")):
        return _parse_url(text)
    for prefix in HUB_PREFIXES:
        if text.startswith(prefix):
            return _parse_repo_tag(text[len(prefix) :], text)
    if ":" in text and "/" in text and not text.startswith(("/", ".", "~")) and ".gguf" not in text:
        return _parse_repo_tag(text, text, required_tag=True)  # llama.cpp's -hf form; never a file path
    return None


def _parse_repo_tag(rest: str, text: str, required_tag: bool = False) -> HubRef | None:
    segments = rest.split("/")
    if not required_tag and len(segments) > 2 and rest.endswith(".gguf"):  # hf://ORG/REPO/PATH.gguf
        repo = "/".join(segments[:2])
        if _REPO.fullmatch(repo):
            return HubRef(repo, filename=_file_path(segments[2:], text))
    repo, _, tag = rest.partition(":")
    if not _REPO.fullmatch(repo) or (tag and not _TAG.fullmatch(tag)) or (required_tag and not tag):
        if required_tag:
            return None  # ORG/REPO:QUANT is one reading of a path with a colon; not this one
        raise ValueError(f"{text!r} is not a hub model name: expected hf://ORG/REPO or hf://ORG/REPO:QUANT")
    return HubRef(repo, tag or None)


def _parse_url(text: str) -> HubRef | None:
    url = urlsplit(text)
    hosts = {urlsplit(DEFAULT_ENDPOINT).netloc, "hf.co", urlsplit(endpoint()).netloc}
    if url.netloc not in hosts:
        return None
    parts = url.path.strip("/").split("/")
    if len(parts) < 5 or parts[2] not in ("resolve", "blob") or not parts[-1].endswith(".gguf"):
        raise ValueError(
            f"{text!r} is not a hub file URL: expected {DEFAULT_ENDPOINT}/ORG/REPO/resolve/REVISION/FILE.gguf"
        )
    repo = f"{parts[0]}/{parts[1]}"
    if not _REPO.fullmatch(repo):
        raise ValueError(f"{text!r}: {repo!r} is not a repository name ORG/REPO")
    return HubRef(repo, filename=_file_path(parts[4:], text), revision=parts[3])


def _file_path(segments: list[str], text: str) -> str:
    if any(s in ("", ".", "..") for s in segments):
        raise ValueError(f"{text!r} is not a hub file: its path in the repository has empty or '..' parts")
    return "/".join(segments)


# ---- choosing the file ------------------------------------------------------------------------------


def split_info(path: str) -> tuple[str, int, int]:
    """(prefix, part number, part count) of a file path, as llama.cpp's get_gguf_split_info: (path, 1, 1)
    for a file that is not a split part."""
    name = path.rsplit("/", 1)[-1]
    m = SPLIT_FILE_NAME.match(name)
    if m is None:
        return path, 1, 1
    return path[: len(path) - len(name)] + m["prefix"], int(m["no"]), int(m["count"])


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".gguf") and "mmproj" not in name and "imatrix" not in name


def choose_files(files: list[str], ref: HubRef, where: str) -> list[str]:
    """The repo files the model is made of (one, or every part of a split model in order)."""
    models = sorted(f for f in files if is_model_file(f))
    if ref.filename is not None:
        if ref.filename not in files:
            raise HubError(f"{ref}: no file {ref.filename!r} in {where} (GGUF files: {_listing(models)})")
        primary = ref.filename
        if split_info(primary)[1] != 1:
            raise HubError(f"{ref}: {primary} is not the first part of its split model: name -00001-of-")
    else:
        primary = _best_model(models, ref.quant)
        if primary is None:
            what = f"GGUF file tagged {ref.quant}" if ref.quant else "GGUF model file"
            raise HubError(f"{ref}: {where} has no {what} (GGUF files: {_listing(models)})")
    prefix, _, count = split_info(primary)
    if count == 1:
        return [primary]
    parts = {split_info(f)[1]: f for f in files if split_info(f)[::2] == (prefix, count)}
    missing = [i for i in range(1, count + 1) if i not in parts]
    if missing:
        raise HubError(f"{ref}: {where} lacks part(s) {missing} of the {count}-part model {primary}")
    return [parts[i] for i in range(1, count + 1)]


def _best_model(models: list[str], quant: str | None) -> str | None:
    firsts = [f for f in models if split_info(f)[1] == 1]
    for tag in (quant,) if quant else DEFAULT_QUANTS:
        pattern = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
        for f in firsts:
            if pattern.search(f):
                return f
    return firsts[0] if firsts and not quant else None


def _listing(models: list[str]) -> str:
    return ", ".join(models[:20]) + (" ..." if len(models) > 20 else "") if models else "none"


# ---- the local cache --------------------------------------------------------------------------------


def repo_dir(repo: str) -> Path:
    return cache_dir() / ("models--" + repo.replace("/", "--"))


def _snapshot(ref: HubRef) -> Path | None:
    storage = repo_dir(ref.repo)
    commit = ref.revision
    if not _COMMIT.fullmatch(commit):
        ref_file = storage / "refs" / ref.revision
        if not ref_file.is_file():
            return None
        commit = ref_file.read_text().strip()
    snapshot = storage / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def cached_files(ref: HubRef) -> list[Path] | None:
    """The model's files from the cache, chosen as from the hub's listing; None unless all are there."""
    snapshot = _snapshot(ref)
    if snapshot is None:
        return None
    files = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf") if p.is_file()]
    try:
        names = choose_files(files, ref, str(snapshot))
    except HubError:
        return None
    return [snapshot / n for n in names]


# ---- pulling ----------------------------------------------------------------------------------------


def resolve(ref: HubRef, download: bool = True, progress: Progress | None = None) -> Path:
    """The model's local path (its first part): the cache's if it is there, else pulled now."""
    local = cached_files(ref)
    if local is not None:
        return local[0]
    if not download:
        raise HubError(f"model {ref} is not downloaded yet (run: edgellm pull {ref})")
    log(f"downloading {ref} from {endpoint()} into {cache_dir()}")
    return pull(ref, progress)[0]


def pull(ref: HubRef, progress: Progress | None = None) -> list[Path]:
    """Every file of the model at the revision the hub has now, downloading what the cache lacks."""
    if offline():
        local = cached_files(ref)
        if local is None:
            raise HubError(f"{ref}: HF_HUB_OFFLINE is set and the model is not in the cache ({cache_dir()})")
        return local
    HfApi, hf_hub_download = _huggingface_hub()
    api = HfApi(endpoint=endpoint())
    try:
        info = api.model_info(ref.repo, revision=ref.revision, files_metadata=True)
    except Exception as e:  # network, auth and not-found errors alike: say which, with the hub's words
        raise HubError(f"{ref}: {_hub_failure(e)}") from e
    siblings = {s.rfilename: s for s in info.siblings or []}
    names = choose_files(list(siblings), ref, f"{ref.repo} at {endpoint()}")
    paths = []
    for name in names:
        pointer = repo_dir(ref.repo) / "snapshots" / info.sha / name
        fresh = not pointer.exists()
        try:
            path = Path(
                hf_hub_download(
                    ref.repo,
                    name,
                    revision=info.sha,
                    cache_dir=cache_dir(),
                    endpoint=endpoint(),
                    tqdm_class=_progress_bar(progress, name),
                )
            )
        except Exception as e:
            raise HubError(f"{ref}: downloading {name} failed: {_hub_failure(e)}") from e
        lfs = siblings[name].lfs
        if fresh and lfs is not None:
            _check_sha256(ref, path, lfs.sha256)
        paths.append(path)
    if ref.revision != info.sha:  # what a model argument finds in the cache without asking the hub
        refs = repo_dir(ref.repo) / "refs" / ref.revision
        refs.parent.mkdir(parents=True, exist_ok=True)
        refs.write_text(info.sha)
    return paths


def _huggingface_hub():
    """huggingface_hub's client, imported with its telemetry off unless the user asks for it: otherwise it
    also fetches {HF_ENDPOINT}/api/agent-harnesses (a registry for its user-agent string) on first use."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from huggingface_hub import HfApi, hf_hub_download

    return HfApi, hf_hub_download


def _hub_failure(e: Exception) -> str:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, GatedRepoError):
        return f"the repository is gated: accept its terms on the hub and set HF_TOKEN ({first})"
    if isinstance(e, RepositoryNotFoundError):
        return f"no such repository at {endpoint()} (or it is private: set HF_TOKEN) ({first})"
    if isinstance(e, RevisionNotFoundError):
        return f"no such revision ({first})"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if status in (401, 403):
        return f"not authorized: set HF_TOKEN to a token with access ({first})"
    if _unreachable(e):
        return (
            f"cannot reach the hub at {endpoint()} ({first}): check the network connection (or the proxy, "
            "HTTPS_PROXY), or set HF_ENDPOINT to a mirror; models already downloaded work without it "
            "(HF_HUB_OFFLINE=1 stops asking the hub at all)"
        )
    return f"{type(e).__name__}: {first}"


def _unreachable(e: BaseException) -> bool:
    """Whether `e` (or what it wraps) is a failure to connect to the hub at all: no network, a name that
    does not resolve, a refused connection, a proxy error, a connect or read timeout."""
    import socket

    kinds: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, socket.gaierror, socket.herror)
    try:  # huggingface_hub's HTTP library
        import httpx

        kinds += (httpx.NetworkError, httpx.TimeoutException, httpx.ProxyError)
    except ImportError:
        pass
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, kinds):
            return True
        e = e.__cause__ or e.__context__
    return False


def _check_sha256(ref: HubRef, path: Path, expected: str) -> None:
    actual = file_sha256(path)
    if actual == expected:
        return
    blob = path.resolve()
    path.unlink(missing_ok=True)  # the snapshot's link, then the blob: a retry downloads it again
    blob.unlink(missing_ok=True)
    raise ChecksumError(
        f"{ref}: {path.name} does not match the hub's sha256 (expected {expected}, got {actual}); "
        "the download was deleted"
    )


def _progress_bar(progress: Progress | None, name: str) -> type:
    """huggingface_hub's tqdm (a bar on a terminal) named by the file rather than its URL, also reporting
    the file's bytes to `progress`."""
    from huggingface_hub.utils import tqdm

    class ReportingBar(tqdm):
        def __init__(self, *args, **kwargs) -> None:
            kwargs["desc"] = name
            super().__init__(*args, **kwargs)
            self.done, self.size = kwargs.get("initial", 0), kwargs.get("total")

        def update(self, n: float | None = 1) -> bool | None:
            self.done += n or 0  # counted here: a disabled bar (no terminal) counts nothing
            if progress is not None:
                progress(name, int(self.done), self.size)
            return super().update(n)

    return ReportingBar


def progress_lines(say: Callable[[str], None], step: float = 0.1) -> Progress:
    """A Progress saying "downloading FILE: 40% of 12 MB" every `step` of a file (the TUI's loading panel)."""
    said: dict[str, float] = {}

    def progress(name: str, done: int, total: int | None) -> None:
        if not total:
            return
        frac = done / total
        if frac >= 1 or frac - said.get(name, -1.0) >= step:
            said[name] = frac
            say(f"downloading {name}: {frac:.0%} of {total / 1e6:.1f} MB")

    return progress


def log(msg: str) -> None:
    print(f"edgellm: {msg}", file=sys.stderr, flush=True)


# ---- the store: what is downloaded ------------------------------------------------------------------


@dataclass(frozen=True)
class CachedModel:
    name: str  # hf://ORG/REPO/FILE (the first part of a split model)
    repo: str
    files: tuple[Path, ...]  # the snapshot paths
    size_bytes: int


def cached_models() -> list[CachedModel]:
    """Every GGUF model in the hub cache (any revision), one entry per model file or split model."""
    out = []
    root = cache_dir()
    for storage in sorted(root.glob("models--*--*")) if root.is_dir() else ():
        repo = storage.name[len("models--") :].replace("--", "/", 1)
        for snapshot in sorted((storage / "snapshots").glob("*")):
            files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf"))
            for name in files:
                if not is_model_file(name) or split_info(name)[1] != 1:
                    continue
                prefix, _, count = split_info(name)
                group = [f for f in files if split_info(f)[::2] == (prefix, count)]
                paths = tuple(snapshot / f for f in group)
                size = sum(p.stat().st_size for p in paths if p.exists())
                out.append(CachedModel(f"hf://{repo}/{name}", repo, paths, size))
    return out


def remove(model: CachedModel) -> None:
    """Delete a cached model's files (their blobs too), and its repository once nothing is left in it."""
    storage = repo_dir(model.repo)
    blobs = {path.resolve() for path in model.files}
    for path in model.files:
        path.unlink(missing_ok=True)
    linked = {p.resolve() for p in (storage / "snapshots").rglob("*") if p.is_symlink()}
    for blob in blobs - linked:  # a blob another revision's snapshot still links to stays
        blob.unlink(missing_ok=True)
    if not any(p.is_file() for p in (storage / "snapshots").rglob("*")):
        shutil.rmtree(storage, ignore_errors=True)
