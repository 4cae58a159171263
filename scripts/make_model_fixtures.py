"""Write llama.cpp reference fixtures for the model tests (greedy continuations and teacher-forced logits).

Needs llama-cpp-python (`pip install llama-cpp-python==0.3.36`, compiles ~10 min); never part of the
default test run. Usage: python scripts/make_model_fixtures.py [--embeddings] [NAME ...]
-> tests/fixtures/model_<name>.json (greedy continuations, logits), or with --embeddings only
tests/fixtures/embed_<name>.json (llama.cpp's mean-pooled, normalized embeddings of EMBED_TEXTS).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgellm.catalog import resolve_model  # noqa: E402
from edgellm.testing.llamacpp_oracle import without_extra_buffer_types  # noqa: E402

GREEDY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nName three colors.<end_of_turn>\n<start_of_turn>model\n",
    "Water boils at a temperature of",
    "The three primary colors are",
    "import numpy as np\n\n# Compute the mean of a list\ndef mean(",
    "Q: What is the largest planet in the solar system?\nA:",
    "The quick brown fox",
    "In 1969, Neil Armstrong",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a haiku about "
    "autumn.<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nExplain photosynthesis in one sentence.<end_of_turn>\n<start_of_turn>model\n",
    "1, 2, 3, 4, 5,",
]
GREEDY_TOKENS = 48

SCORE_TEXT = (
    "The history of computing is longer than the history of computing hardware and modern computing "
    "technology and includes the history of methods intended for pen and paper or for chalk and slate, "
    "with or without the aid of tables. Digital computing is intimately tied to the representation of "
    "numbers. But long before abstractions like the number arose, there were mathematical concepts to "
    "serve the purposes of civilization. These concepts are implicit in concrete practices such as "
    "one-to-one correspondence, the basis of counting, comparison to a standard, used for measurement, "
    "and the 3-4-5 right triangle, a device for assuring a right angle."
)
TOP_K_SAVED = 20
EMBED_TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "What is an LLM?"]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def make(name: str) -> dict:
    import llama_cpp

    without_extra_buffer_types()
    path = resolve_model(name)
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=1024, n_batch=512, n_threads=2, logits_all=True, verbose=False, seed=0
    )
    greedy = []
    for prompt in GREEDY_PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        out: list[int] = []
        margins: list[float] = []  # llama.cpp's own top-1 minus top-2 logit at each step
        for _ in range(GREEDY_TOKENS):
            logits = np.asarray(llm.scores[llm.n_tokens - 1])
            tok = int(np.argmax(logits))
            top2 = np.partition(logits, -2)[-2:]
            margins.append(round(float(top2[1] - top2[0]), 4))
            out.append(tok)
            if tok == llm.token_eos():
                break
            llm.eval([tok])
        greedy.append({"prompt": prompt, "prompt_ids": ids, "output_ids": out, "margins": margins})

    ids = llm.tokenize(SCORE_TEXT.encode(), add_bos=True, special=True)
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids)], dtype=np.float32)  # [T, n_vocab]
    lsm = log_softmax(logits)
    nll = [-float(lsm[t, ids[t + 1]]) for t in range(len(ids) - 1)]
    sample_positions = [0, 1, len(ids) // 2, len(ids) - 1]
    top = {}
    for t in sample_positions:
        order = np.argsort(-logits[t])[:TOP_K_SAVED]
        top[str(t)] = [[int(i), float(logits[t, i])] for i in order]
    return {
        "model": name,
        "generator": f"llama-cpp-python {llama_cpp.__version__}, 2 threads, greedy = argmax of logits",
        "greedy": greedy,
        "score": {
            "ids": ids,
            "top1": [int(i) for i in logits.argmax(axis=-1)],
            "nll": nll,
            "perplexity": float(np.exp(np.mean(nll))),
            "top_logits": top,
        },
    }


def make_embeddings(name: str) -> dict:
    import llama_cpp

    without_extra_buffer_types()
    ref = llama_cpp.Llama(
        str(resolve_model(name)),
        n_ctx=256,
        n_threads=2,
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        verbose=False,
    )
    vectors = np.asarray(ref.embed(EMBED_TEXTS, normalize=True), dtype=np.float32)
    return {
        "model": name,
        "generator": f"llama-cpp-python {llama_cpp.__version__}, mean pooling, L2-normalized",
        "texts": EMBED_TEXTS,
        "embeddings": [[round(float(v), 7) for v in row] for row in vectors],
    }


def main() -> None:
    out_dir = ROOT / "tests" / "fixtures"
    out_dir.mkdir(parents=True, exist_ok=True)
    args = sys.argv[1:]
    embeddings = "--embeddings" in args
    for name in [a for a in args if a != "--embeddings"] or ["smollm2-135m", "gemma3-270m"]:
        if embeddings:
            dest = out_dir / f"embed_{name}.json"
            dest.write_text(json.dumps(make_embeddings(name)) + "\n")
            print(f"wrote {dest}")
            continue
        data = make(name)
        dest = out_dir / f"model_{name}.json"
        dest.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {dest}: perplexity {data['score']['perplexity']:.4f}")


if __name__ == "__main__":
    main()
