"""Write tests/fixtures/chat_template_{smollm2,gemma3}.json: chat prompts rendered by llama.cpp's own
C++ template engine (``llama_chat_apply_template`` through llama-cpp-python's low-level API, not its
Python Jinja formatter), and the token ids llama.cpp makes of them.

llama.cpp's ``llama_chat_apply_template`` recognises known template families by pattern and formats them
in C++ (it does not run Jinja):
* SmolLM2: the GGUF template is passed in; llama.cpp detects ChatML. SmolLM2's Jinja template also
  inserts a default system prompt when the conversation has none, which the C++ ChatML formatter does
  not do; for those cases the fixture renders llama.cpp on the messages with that system prompt
  prepended (``llama_messages``) so the test still compares whole texts.
* Gemma 3 270M: the GGUF has no template; llama.cpp's built-in "gemma" format is used. It never writes
  BOS (llama.cpp adds it when tokenizing), while Google's template starts with ``{{ bos_token }}``; the
  token ids are the common ground, and the test also compares text after the BOS.

Token ids: llama.cpp tokenizes the rendered text with add_special=True, parse_special=True (as its
server does).

    python scripts/make_chat_template_fixtures.py   # needs llama-cpp-python and the two models
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgellm.catalog import resolve_model  # noqa: E402

SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

CONVERSATIONS: list[tuple[str, list[dict[str, str]]]] = [
    ("system_user", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}]),
    (
        "multi_turn",
        [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "What is the capital of Italy?"},
            {"role": "assistant", "content": "Rome."},
            {"role": "user", "content": "And of Spain?\nBe brief."},
        ],
    ),
    ("user_only", [{"role": "user", "content": "Write a haiku about café au lait ☕."}]),
    (
        "user_assistant_user",
        [
            {"role": "user", "content": "  padded question  "},
            {"role": "assistant", "content": "An answer."},
            {"role": "user", "content": "Thanks"},
        ],
    ),
]


def apply_template(tmpl: bytes, messages: list[dict[str, str]], add_ass: bool) -> str:
    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []  # the C strings must outlive the call
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(tmpl, arr, len(messages), add_ass, buf, size)
    if n < 0:
        raise RuntimeError(f"llama_chat_apply_template failed ({n}) for template {tmpl[:40]!r}")
    assert n < size
    return buf.raw[:n].decode("utf-8")


def build(name: str, model: str) -> dict:
    path = resolve_model(model)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    template = llm.metadata.get("tokenizer.chat_template")
    tmpl = template.encode() if template else b"gemma"
    cases = []
    for case, messages in CONVERSATIONS:
        llama_messages = messages
        if name == "smollm2" and messages[0]["role"] != "system":
            llama_messages = [{"role": "system", "content": SMOLLM2_DEFAULT_SYSTEM}, *messages]
        for add_ass in (True, False):
            text = apply_template(tmpl, llama_messages, add_ass)
            ids = llm.tokenize(text.encode(), add_bos=True, special=True)
            cases.append(
                {
                    "name": f"{case}{'' if add_ass else '_no_gen_prompt'}",
                    "messages": messages,
                    "llama_messages": llama_messages,
                    "add_generation_prompt": add_ass,
                    "llama_text": text,
                    "llama_token_ids": ids,
                }
            )
    return {
        "model": model,
        "file": path.name,
        "llama_cpp_version": llama_cpp.__version__,
        "llama_template": "gguf tokenizer.chat_template" if template else "built-in 'gemma'",
        "cases": cases,
    }


def main() -> None:
    out_dir = ROOT / "tests" / "fixtures"
    for name, model in (("smollm2", "smollm2-135m"), ("gemma3", "gemma3-270m")):
        data = build(name, model)
        out = out_dir / f"chat_template_{name}.json"
        out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote {out} ({len(data['cases'])} cases, llama.cpp template: {data['llama_template']})")


if __name__ == "__main__":
    main()
