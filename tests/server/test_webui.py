"""The chat page over HTTP (issue 64): / answers a browser with the page and its CSP and everyone else with
Ollama's probe answer; the assets come with their content types, all from the package and all named by the
page; with --api-key the page and its assets load without the key while the APIs still want it. In the
browser: test_webui_browser.py."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from edgellm.config import ServerConfig
from edgellm.engine.config import EngineConfig
from edgellm.server import webui
from edgellm.server.app import build_app
from edgellm.server.state import ServerState
from edgellm.testing.http_attacks import EVIL_HOST, AsgiClient
from edgellm.testing.servers import ROOT, httpx, start_server, stop_server
from edgellm.testing.synthetic.models import write_tiny_model

HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}  # Chromium's
HTML_ACCEPT = ("Accept", HTML["Accept"])
KEY = "webui-key"


def _assert_page(r: httpx.Response) -> None:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert "<title>edgellm chat</title>" in r.text
    csp = {d.split()[0]: d.split()[1:] for d in r.headers["content-security-policy"].split("; ")}
    assert csp["default-src"] == csp["script-src"] == csp["connect-src"] == ["'self'"]
    assert csp["frame-ancestors"] == ["'none'"] and "'unsafe-inline'" not in str(csp)
    assert r.headers["x-content-type-options"] == "nosniff"


def _assert_assets(url: str) -> None:
    for name in webui.ASSETS:
        r = httpx.get(f"{url}/ui/{name}")
        assert r.status_code == 200, (name, r.text)
        assert r.headers["content-type"] == webui.CONTENT_TYPES[Path(name).suffix], name
        assert r.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(f"{url}/favicon.ico").headers["content-type"] == "image/svg+xml"
    for wrong in ("/ui/index.html", "/ui/__init__.py", "/ui/..%2f__init__.py", "/ui/nope.js"):
        assert httpx.get(url + wrong).status_code == 404, wrong


def test_the_page_for_browsers_and_the_ollama_answer_for_others(apis_server: str) -> None:
    page = httpx.get(f"{apis_server}/", headers=HTML)
    _assert_page(page)
    assert '<meta name="edgellm-api-key" content="none">' in page.text
    assert httpx.head(f"{apis_server}/", headers=HTML).headers["content-security-policy"]
    for accept in ({}, {"Accept": "*/*"}, {"Accept": "application/json"}):
        r = httpx.get(f"{apis_server}/", headers=accept)
        assert (r.status_code, r.text) == (200, "Ollama is running"), accept
    _assert_assets(apis_server)


def test_the_page_names_only_its_own_assets_and_they_ship_in_the_package() -> None:
    page = (webui.HERE / "index.html").read_text()
    named = set(re.findall(r'(?:src|href)="([^"]+)"', page))
    assert named == {f"/ui/{n}" for n in ("style.css", "app.js", "icon.svg")}
    imports = set()
    for script in [n for n in webui.ASSETS if n.endswith(".js")]:
        imports |= set(re.findall(r'from "\./([\w.]+)"', (webui.HERE / script).read_text()))
    assert imports <= set(webui.ASSETS)
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    for f in webui.HERE.iterdir():
        if f.is_file() and f.suffix != ".py":
            assert any(fnmatch(f.name, g) for g in globs), f"{f.name} would not ship: add it to package-data"


def test_the_host_and_origin_guard_holds_for_the_page_and_its_assets() -> None:
    """A page of another site (or a rebinding name) cannot load or frame the chat page either; the page's
    own origin passes."""
    state = ServerState(ServerConfig(EngineConfig("unused.gguf"), api_key=KEY))  # type: ignore[arg-type]
    app = AsgiClient(build_app(state))
    here = "127.0.0.1:8080"
    for path in ("/", "/ui/app.js", "/favicon.ico"):
        ok = app.request("GET", path, [HTML_ACCEPT, ("Origin", f"http://{here}")], host=here)
        assert ok.status == 200, (path, ok)
        assert app.request("GET", path, [HTML_ACCEPT], host=EVIL_HOST).status == 403, path
        evil = app.request("GET", path, [HTML_ACCEPT, ("Origin", f"http://{EVIL_HOST}")], host=here)
        assert evil.status == 403, path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tiny_model(tmp_path_factory.mktemp("webui") / "tiny.gguf", "llama", seed=1))


@pytest.mark.parametrize("kind", ["single", "router"])
def test_with_an_api_key_the_page_and_assets_load_without_it(tiny_model: str, kind: str) -> None:
    models = [tiny_model] if kind == "single" else ["--models", tiny_model]
    proc, url = start_server(None, *models, "--ctx", "128", "--kv-cache-memory", "1M", "--api-key", KEY)
    try:
        page = httpx.get(f"{url}/", headers=HTML)
        _assert_page(page)
        assert '<meta name="edgellm-api-key" content="required">' in page.text  # it asks before calling
        _assert_assets(url)
        assert httpx.get(f"{url}/").status_code == 401  # the Ollama probe answer stays behind the key
        assert httpx.get(f"{url}/v1/models").status_code == 401
        ok = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200, ok.text
        # The page's requests carry its own origin: the guard lets them through, and no other origin.
        page_origin = {"Origin": url, "Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{url}/v1/models", headers=page_origin).status_code == 200
        evil = {"Origin": "http://evil.example", **HTML}
        assert httpx.get(f"{url}/ui/app.js", headers=evil).status_code == 403
    finally:
        stop_server(proc)
