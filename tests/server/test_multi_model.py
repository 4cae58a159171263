"""`edgellm serve --models A,B` (edgellm/server/multi/router.py): two tiny models behind one port, each loaded
on first use in its own server and engine process, routed by the request's model field, unloaded when idle."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import ollama
import pytest

from edgellm.testing.limits import HANG_S
from edgellm.testing.servers import ROOT, child_pids, cmdline, httpx, start_server, stop_server
from edgellm.testing.synthetic.models import write_tiny_model


def _start_router(*args: str) -> tuple[subprocess.Popen, str]:
    return start_server(None, *args)


def _loaded(url: str, headers: dict[str, str] | None = None) -> dict[str, bool]:
    data = httpx.get(f"{url}/v1/models", headers=headers, timeout=10).json()["data"]
    return {m["id"]: m["status"]["loaded"] for m in data}


def test_two_models_behind_one_port(tmp_path: Path) -> None:
    a = str(write_tiny_model(tmp_path / "a.gguf", "llama", seed=1))
    b = str(write_tiny_model(tmp_path / "b.gguf", "qwen3", seed=2))
    router, url = _start_router(
        "--models", f"{a},{b}", "--keep-alive", "6", "--ctx", "128", "--kv-cache-memory", "1M"
    )
    try:
        assert _loaded(url) == {a: False, b: False}  # nothing loads before it is asked for

        async def both() -> list:
            async with httpx.AsyncClient(timeout=300) as client:
                bodies = [{"model": m, "prompt": "hello", "max_tokens": 4, "temperature": 0} for m in (a, b)]
                return await asyncio.gather(*(client.post(f"{url}/v1/completions", json=x) for x in bodies))

        ra, rb = asyncio.run(both())
        assert (ra.status_code, rb.status_code) == (200, 200), (ra.text, rb.text)
        assert ra.json()["model"] == a and rb.json()["model"] == b
        assert _loaded(url) == {a: True, b: True}

        unknown = httpx.post(f"{url}/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=10)
        assert unknown.status_code == 404 and a in unknown.text and b in unknown.text

        servers = {cmdline(p).split(" serve ")[1].split()[0]: p for p in child_pids(router.pid)}
        cores = [p for p in child_pids(servers[a]) if "edgellm" in cmdline(p) or "python" in cmdline(p)]
        assert cores, "model a's server has no engine process"
        for core in cores:  # kill -9 of model a's engine core
            os.kill(core, signal.SIGKILL)
        again = httpx.post(
            f"{url}/v1/completions", json={"model": b, "prompt": "hi", "max_tokens": 4}, timeout=120
        )
        assert again.status_code == 200, again.text  # b never noticed
        deadline = time.monotonic() + 120  # a's server restarts its core: 503 meanwhile, then a answers
        body = {"model": a, "prompt": "hi", "max_tokens": 4}
        while (r := httpx.post(f"{url}/v1/completions", json=body, timeout=120)).status_code == 503:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.5)
        assert r.status_code == 200, r.text

        deadline = time.monotonic() + 90
        while (any(_loaded(url).values()) or child_pids(router.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _loaded(url) == {a: False, b: False}  # both unloaded after 6 idle seconds
        left = child_pids(router.pid)
        assert left == [], [cmdline(p) for p in left]  # their processes have ended
    finally:
        stop_server(router)


def test_models_max_unloads_the_least_recently_used_and_load_unload_routes(tmp_path: Path) -> None:
    a = str(write_tiny_model(tmp_path / "a.gguf", "llama", seed=1))
    b = str(write_tiny_model(tmp_path / "b.gguf", "llama", seed=2))
    presets = tmp_path / "presets.toml"
    presets.write_text(f'[models."{b}"]\nctx = 64\nmax_queue = 8\ntemperature = 0.0\n')
    router, url = _start_router(
        "--models", f"{a},{b}", "--models-max", "1", "--ctx", "128", "--presets", str(presets),
        "--api-key", "k", "--top-k", "5",
    )  # fmt: skip
    key = {"Authorization": "Bearer k"}
    try:
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401  # every route wants the key
        assert httpx.post(f"{url}/models/load", json={"model": a}, timeout=10).status_code == 401
        load = httpx.post(f"{url}/models/load", json={"model": a}, headers=key, timeout=300)
        assert load.status_code == 200 and load.json() == {"model": a, "loaded": True}
        assert _loaded(url, key) == {a: True, b: False}
        body = {"model": b, "prompt": "hi", "max_tokens": 2}
        r = httpx.post(f"{url}/v1/completions", json=body, headers=key, timeout=300)
        assert r.status_code == 200, r.text
        assert _loaded(url, key) == {a: False, b: True}  # one at most: a, idle, made room
        [server] = [p for p in child_pids(router.pid) if f" serve {b} " in cmdline(p)]
        assert "--api-key" not in cmdline(server)  # the key goes through the environment, not ps
        own = cmdline(server).split(" --port ")[1].split()[0]  # the model's server checks the key too
        assert httpx.get(f"http://127.0.0.1:{own}/v1/models", timeout=10).status_code == 401
        assert httpx.get(f"http://127.0.0.1:{own}/v1/models", headers=key, timeout=10).status_code == 200
        # b's preset after the command line's flags (--ctx=128, --top-k=5), so it wins
        assert cmdline(server).endswith("--top-k=5 --ctx=64 --max-queue=8 --temperature=0.0 ")
        # the preset's temperature 0 is b's default: a request without one is greedy
        omitted = {"model": b, "prompt": "hi", "max_tokens": 8, "seed": 3}
        replies = [
            httpx.post(f"{url}/v1/completions", json=body, headers=key, timeout=300).json()
            for body in (omitted, {**omitted, "temperature": 0}, {**omitted, "temperature": 1.0})
        ]
        texts = [r["choices"][0]["text"] for r in replies]
        assert texts[0] == texts[1] != texts[2], texts
        unload = httpx.post(f"{url}/models/unload", json={"model": b}, headers=key, timeout=120)
        assert unload.status_code == 200 and _loaded(url, key) == {a: False, b: False}
        assert (
            httpx.post(f"{url}/models/load", json={"model": "c"}, headers=key, timeout=10).status_code == 404
        )
    finally:
        stop_server(router)


def test_a_presets_file_with_an_unknown_key_is_an_error(tmp_path: Path) -> None:
    presets = tmp_path / "presets.toml"
    presets.write_text('[models."m"]\ntemperatur = 0.2\n')
    cmd = [sys.executable, "-m", "edgellm", "serve", "--models", "m", "--presets", str(presets)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 1 and "unsupported key(s) ['temperatur']" in proc.stderr
    presets.write_text('[models."other"]\nctx = 64\n')
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 1 and "preset for 'other', which --models does not serve (m)" in proc.stderr


# ---- the other APIs through one router (one per module: it starts a server per model) ----------------
KEY = "router-key"
BEARER = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def apis_router(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("router")
    a = str(write_tiny_model(d / "a.gguf", "llama", seed=1))
    b = str(write_tiny_model(d / "b.gguf", "qwen3", seed=2))
    router, url = _start_router(
        "--models", f"{a},{b}", "--ctx", "128", "--kv-cache-memory", "1M", "--api-key", KEY
    )  # fmt: skip
    try:
        yield url, a, b, router.pid
    finally:
        stop_server(router)


def test_ollama_client_lists_chats_with_each_model_and_sees_them_loaded(apis_router) -> None:
    url, a, b, _ = apis_router
    client = ollama.Client(host=url, headers=BEARER, timeout=300)
    assert httpx.get(f"{url}/api/tags", timeout=10).status_code == 401  # the key, as on every route
    assert {m.model for m in client.list().models} == {a, b}  # servable, loaded or not
    assert [m.size for m in client.list().models] == [Path(a).stat().st_size, Path(b).stat().st_size]
    msgs, opts = [{"role": "user", "content": "hello"}], {"num_predict": 4, "temperature": 0}
    for name in (a, b):
        r = client.chat(model=name, messages=msgs, options=opts)
        assert r.model == name and r.done and r.eval_count == 4
        parts = list(client.chat(model=name, messages=msgs, options=opts, stream=True))
        assert parts[-1].done and "".join(p.message.content for p in parts) == r.message.content
    ps = client.ps().models
    assert {m.model for m in ps} == {a, b} and all(m.context_length == 128 for m in ps)
    assert client.pull(a).status == "success"
    assert client.show(b).details.family == "qwen3" and client.show(a).details.family == "llama"
    nowhere = httpx.post(f"{url}/api/nowhere", json={"model": a}, headers=BEARER, timeout=10)
    assert nowhere.status_code == 404 and "/api/nowhere" in nowhere.json()["error"]  # Ollama's shape
    assert httpx.get(f"{url}/api/version", headers=BEARER, timeout=10).json()["version"]
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 404 and a in e.value.error and b in e.value.error  # Ollama's error shape
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("nope")
    assert e.value.status_code == 404 and a in e.value.error


def test_anthropic_sdk_with_x_api_key_through_the_router(apis_router) -> None:
    url, a, b, _ = apis_router
    claude = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=300)  # sends x-api-key
    hi, greedy = [{"role": "user", "content": "hi"}], {"temperature": 0}
    for name in (a, b):  # the whole answer, and the same streamed through the router
        msg = claude.messages.create(model=name, max_tokens=4, messages=hi, extra_body=greedy)
        assert msg.model == name and 1 <= msg.usage.output_tokens <= 4
        with claude.messages.stream(model=name, max_tokens=4, messages=hi, extra_body=greedy) as s:
            streamed = s.get_final_message()
        texts = [[c.text for c in m.content if c.type == "text"] for m in (msg, streamed)]
        assert streamed.model == name and texts[0] == texts[1]
        assert streamed.usage.output_tokens == msg.usage.output_tokens
    assert claude.messages.count_tokens(model=a, messages=[{"role": "user", "content": "hi"}]).input_tokens
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["type"] == "error" and a in e.value.body["error"]["message"]  # Anthropic's shape
    wrong = anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=a, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    # x-api-key is the Anthropic routes' header only, as on the single-model server
    r = httpx.post(f"{url}/v1/completions", json={"model": a, "prompt": "x"}, headers={"x-api-key": KEY})
    assert r.status_code == 401


def test_router_openai_routes_listing_and_default_model(apis_router) -> None:
    url, a, b, _ = apis_router
    one = httpx.get(f"{url}/v1/models/{b}", headers=BEARER, timeout=10)
    assert one.status_code == 200 and one.json()["id"] == b
    missing = httpx.get(f"{url}/models/nope", headers=BEARER, timeout=10)  # unprefixed, as served there
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert a in missing.json()["error"]["message"]
    body = {"prompt": "hello", "max_tokens": 3, "temperature": 0}  # no model: the first one named
    r = httpx.post(f"{url}/completions", json=body, headers=BEARER, timeout=300)
    assert r.status_code == 200 and r.json()["model"] == a, r.text
    r = httpx.post(f"{url}/v1/responses", json={"model": b, "input": "hi", "max_output_tokens": 3},
                   headers=BEARER, timeout=300)  # fmt: skip
    assert r.status_code == 200 and r.json()["model"] == b, r.text
    bad = httpx.post(f"{url}/v1/chat/completions", content=b"[1]", headers=BEARER, timeout=10)
    assert bad.status_code == 400 and "JSON object" in bad.json()["error"]["message"]


def _metric(server_url: str, name: str) -> float:
    text = httpx.get(f"{server_url}/metrics", headers=BEARER, timeout=10).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + "{")))


def test_a_client_leaving_a_relayed_stream_cancels_it_and_frees_the_model(apis_router) -> None:
    url, a, b, router_pid = apis_router
    assert httpx.post(f"{url}/models/load", json={"model": a}, headers=BEARER, timeout=300).status_code == 200
    [server] = [p for p in child_pids(router_pid) if f" serve {a} " in cmdline(p)]
    a_url = f"http://127.0.0.1:{cmdline(server).split(' --port ')[1].split()[0]}"
    before = _metric(a_url, "edgellm_generation_tokens_total")
    body = {"model": a, "prompt": "hello", "max_tokens": 110, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=BEARER, timeout=300) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # the first event, then the client leaves
    deadline = time.monotonic() + 30
    while _metric(a_url, "edgellm_num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)
    generated = _metric(a_url, "edgellm_generation_tokens_total") - before
    assert 0 < generated < 110  # a's server cancelled it
    # and the router counted it out: a unloads (a 409 while a request is in flight)
    u = httpx.post(f"{url}/models/unload", json={"model": a}, headers=BEARER, timeout=60)
    assert u.status_code == 200 and u.json() == {"model": a, "loaded": False}, u.text


def test_router_metrics_merge_the_loaded_models_pages(apis_router) -> None:
    """/metrics on the router: each loaded model's page under one header per family (model_name labels
    them apart) and the router's own gauges; valid for the Prometheus parser; the key as every route."""
    from prometheus_client.parser import text_string_to_metric_families

    url, a, b, _ = apis_router
    assert httpx.get(f"{url}/metrics", timeout=30).status_code == 401
    for model in (a, b):
        body = {"model": model, "prompt": "hi", "max_tokens": 2}
        assert httpx.post(f"{url}/v1/completions", json=body, headers=BEARER, timeout=300).status_code == 200
    r = httpx.get(f"{url}/metrics", headers=BEARER, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert r.text.count("# TYPE edgellm_generation_tokens_total counter") == 1
    generated = {s.labels["model_name"]: s.value for s in families["edgellm_generation_tokens"].samples}
    assert set(generated) == {a, b} and all(v >= 2 for v in generated.values())
    assert families["edgellm_router_models_loaded"].samples[0].value == 2
    relayed = families["edgellm_router_requests_in_flight"].samples
    in_flight = {s.labels["model_name"]: s.value for s in relayed}
    assert in_flight == {a: 0, b: 0}
