"""llama-server's LoRA interface on `edgellm serve BASE --lora A --lora-scaled B 0.5`: GET/POST
/lora-adapters, and the per-request "lora" list on /v1/completions, /v1/chat/completions and /completion
(an adapter the list leaves out is at 0; an unknown id is a 400).
Against one server on a tiny random-weight base."""

from __future__ import annotations

import pytest

from edgellm.testing.servers import httpx, serve
from edgellm.testing.synthetic.lora import write_tiny_lora
from edgellm.testing.synthetic.models import write_tiny_model

PROMPT = "hello there"
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):  # noqa: ANN001, ANN201
    d = tmp_path_factory.mktemp("lora_server")
    base = write_tiny_model(
        d / "base.gguf", "llama", "F32", metadata_overrides={"tokenizer.chat_template": TEMPLATE}
    )
    a = write_tiny_lora(d / "a.gguf", base, rank=4, seed=11)
    b = write_tiny_lora(d / "b.gguf", base, rank=8, seed=12)
    yield from serve(base, "--lora", str(a), "--lora-scaled", str(b), "0.5")


def _complete(url: str, **extra: object) -> httpx.Response:
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def _text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_lora_adapters_route_and_per_request_choice(lora_server: str) -> None:
    url = lora_server
    listed = httpx.get(f"{url}/lora-adapters", timeout=30).json()
    assert [(e["id"], e["path"].rsplit("/", 1)[-1], e["scale"]) for e in listed] == [
        (0, "a.gguf", 1.0),
        (1, "b.gguf", 0.5),
    ]
    default = _text(_complete(url))  # the global scales: A at 1, B at 0.5
    both = _text(_complete(url, lora=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}]))
    only_a = _text(_complete(url, lora=[{"id": 0, "scale": 1.0}]))  # B left out: at 0
    none = _text(_complete(url, lora=[]))
    assert default == both
    assert len({both, only_a, none}) == 3, (both, only_a, none)
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "lora": [{"id": 0, "scale": 1}]}
    native = httpx.post(f"{url}/completion", json=body, timeout=120)
    assert native.status_code == 200 and native.json()["content"] == only_a
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0}
    r_none = httpx.post(f"{url}/v1/chat/completions", json={**chat, "lora": []}, timeout=120)
    r_a = httpx.post(
        f"{url}/v1/chat/completions", json={**chat, "lora": [{"id": 0, "scale": 1}]}, timeout=120
    )
    assert r_none.status_code == 200 and r_a.status_code == 200, (r_none.text, r_a.text)
    assert r_none.json()["choices"][0]["message"] != r_a.json()["choices"][0]["message"]

    # new global scales: A off (left out), B at 0.5 -> the default request now runs B alone
    r = httpx.post(f"{url}/lora-adapters", json=[{"id": 1, "scale": 0.5}], timeout=30)
    assert r.status_code == 200 and r.json() == {"success": True}
    assert [e["scale"] for e in httpx.get(f"{url}/lora-adapters", timeout=30).json()] == [0.0, 0.5]
    assert _text(_complete(url)) == _text(_complete(url, lora=[{"id": 1, "scale": 0.5}])) != both


@pytest.mark.parametrize("path", ["/v1/completions", "/completion", "/v1/chat/completions", "/lora-adapters"])
def test_unknown_adapter_id_is_a_400(lora_server: str, path: str) -> None:
    lora = [{"id": 5, "scale": 1.0}]
    if path == "/lora-adapters":
        body: object = lora
    elif path == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2, "lora": lora}
    else:
        body = {"prompt": PROMPT, "max_tokens": 2, "n_predict": 2, "lora": lora}
        body = {
            k: v for k, v in body.items() if k != ("n_predict" if path == "/v1/completions" else "max_tokens")
        }
    r = httpx.post(f"{lora_server}{path}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "unknown LoRA adapter id 5" in r.text
    bad = httpx.post(
        f"{lora_server}/v1/completions", json={"prompt": PROMPT, "lora": [{"id": "x"}]}, timeout=60
    )
    assert bad.status_code == 400 and "lora" in bad.text
