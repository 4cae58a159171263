"""Images over HTTP: `edgellm serve MODEL --mmproj MMPROJ` takes OpenAI chat image_url parts (base64 data
URLs) and answers as LLM(model, mmproj=...) does for the same rendered prompt; a corrupt image, an
http(s) URL and an image to a server without --mmproj are 400s naming the problem, and the server
keeps answering."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

from edgellm import LLM
from edgellm.sampling.sampler import SamplingParams
from edgellm.testing.paths import ROOT
from edgellm.testing.servers import httpx, start_server, stop_server
from edgellm.testing.synthetic.mmproj import tiny_png, write_tiny_mmproj
from edgellm.testing.synthetic.models import write_tiny_model

# a template that writes each message's text (the parts joined with newlines) on its own line
TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
N = 6
Q = "What is this?"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, bytes]:
    tmp = tmp_path_factory.mktemp("vision_server")
    model = write_tiny_model(tmp / "g3.gguf", "gemma3", qtypes="F32", sliding_window=64, seed=3,
                             metadata_overrides={"tokenizer.chat_template": TEMPLATE})  # fmt: skip
    return model, write_tiny_mmproj(tmp / "mmproj.gguf", 64, seed=4), tiny_png(40, 24, seed=5)


def _chat(url: str, content: list) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": N, "temperature": 0}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=600)


def test_every_route_answers_an_image_question_as_the_python_api(files: tuple[Path, Path, bytes]) -> None:
    """OpenAI image_url, Ollama images, an Anthropic base64 image block and a Responses input_image, each
    before the question:
    the same rendered prompt ("<__media__>What is this?", no newline at the marker, as llama-server),
    so the same greedy answer as LLM(model, mmproj=...)."""
    model, mmproj, png = files
    with LLM(str(model), mmproj=str(mmproj), n_ctx=256) as llm:
        prompt = {"prompt": "<__media__>What is this?\n", "images": [png]}
        want = llm.generate([prompt], SamplingParams(max_tokens=N, temperature=0))[0].text
    b64 = base64.b64encode(png).decode()
    data_url = "data:image/png;base64," + b64
    proc, url = start_server(str(model), "--mmproj", str(mmproj), "--ctx", "256")
    try:
        r = _chat(url, [{"type": "image_url", "image_url": {"url": data_url}}, {"type": "text", "text": Q}])
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == want
        body = {"model": "m", "stream": False, "options": {"temperature": 0, "num_predict": N},
                "messages": [{"role": "user", "content": Q, "images": [b64]}]}  # fmt: skip
        r = httpx.post(url + "/api/chat", json=body, timeout=600)
        assert r.status_code == 200, r.text
        assert r.json()["message"]["content"] == want
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
        body = {"model": "m", "max_tokens": N, "temperature": 0,
                "messages": [{"role": "user", "content": [image, {"type": "text", "text": Q}]}]}  # fmt: skip
        r = httpx.post(url + "/v1/messages", json=body, timeout=600)
        assert r.status_code == 200, r.text
        assert r.json()["content"][0]["text"] == want
        content = [{"type": "input_image", "image_url": data_url}, {"type": "input_text", "text": Q}]
        body = {"model": "m", "max_output_tokens": N, "temperature": 0,
                "input": [{"role": "user", "content": content}]}  # fmt: skip
        r = httpx.post(url + "/v1/responses", json=body, timeout=600)
        assert r.status_code == 200, r.text
        message = next(o for o in r.json()["output"] if o["type"] == "message")
        assert message["content"][0]["text"] == want
        cut = "data:image/png;base64," + base64.b64encode(png[:40]).decode()  # a truncated PNG
        bad = _chat(url, [{"type": "image_url", "image_url": {"url": cut}}])
        assert bad.status_code == 400 and "cannot decode" in bad.json()["error"]["message"]
        remote = _chat(url, [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])
        assert remote.status_code == 400 and "data URL" in remote.json()["error"]["message"]
        many = _chat(url, [{"type": "image_url", "image_url": {"url": data_url}}] * 17)
        assert many.status_code == 400 and "at most 16" in many.json()["error"]["message"]
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        card = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
        assert card["input_modalities"] == ["text", "image"]
        show = httpx.post(url + "/api/show", json={"model": card["id"]}, timeout=30).json()
        assert "vision" in show["capabilities"]
    finally:
        stop_server(proc)


def test_edgellm_run_with_an_image(files: tuple[Path, Path, bytes], tmp_path: Path) -> None:
    """`edgellm run MODEL PROMPT --image PATH`: the image before the question, through the template."""
    model, mmproj, png = files
    with LLM(str(model), mmproj=str(mmproj), n_ctx=256) as llm:
        prompt = {"prompt": "<__media__>What is this?\n", "images": [png]}
        want = llm.generate([prompt], SamplingParams(max_tokens=N, temperature=0))[0].text
    (tmp_path / "x.png").write_bytes(png)
    args = [str(model), Q, "--image", str(tmp_path / "x.png"), "--mmproj", str(mmproj)]
    args += ["--temperature", "0", "--max-tokens", str(N), "--ctx", "256"]
    run = subprocess.run([sys.executable, "-m", "edgellm", "run", *args], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout == want + "\n"
    (tmp_path / "bad.png").write_bytes(png[:40])
    args[3] = str(tmp_path / "bad.png")
    bad = subprocess.run([sys.executable, "-m", "edgellm", "run", *args], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)  # fmt: skip
    assert bad.returncode == 2 and "cannot decode the image" in bad.stderr


def test_an_image_to_a_server_without_mmproj_is_a_400(files: tuple[Path, Path, bytes]) -> None:
    """--mmproj none: the mmproj beside the model is not used (without it, it would be)."""
    model, mmproj, png = files
    with LLM(str(model), n_ctx=256) as llm:
        assert llm.vision is not None and llm.vision.path == mmproj  # found beside the model
    data_url = "data:image/png;base64," + base64.b64encode(png).decode()
    proc, url = start_server(str(model), "--ctx", "256", "--mmproj", "none")
    try:
        r = _chat(url, [{"type": "image_url", "image_url": {"url": data_url}}])
        assert r.status_code == 400 and "takes no images" in r.json()["error"]["message"]
        assert httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["input_modalities"] == ["text"]
    finally:
        stop_server(proc)


def test_agenerate_with_an_image(files: tuple[Path, Path, bytes]) -> None:
    """LLM.agenerate takes image prompts as generate does, and reports the prompt's ids."""
    import asyncio

    model, mmproj, png = files
    prompt = {"prompt": "<__media__>What is this?\n", "images": [png]}
    with LLM(str(model), mmproj=str(mmproj), n_ctx=256) as llm:
        params = SamplingParams(max_tokens=N, temperature=0)
        [want] = llm.generate([prompt], params)
        [got] = asyncio.run(llm.agenerate([prompt], params))
    assert got.text == want.text and got.prompt_token_ids == want.prompt_token_ids
    assert len(got.prompt_token_ids) > 16  # the image's 16 rows and the text
