"""The vision oracle case: a tiny random gemma3 text model, a tiny random gemma3 mmproj and a small PNG,
all written from fixed seeds, and the prompt llama.cpp's libmtmd and edgellm both take. The fixture
(tests/fixtures/vision/<case>.npz, scripts/fixtures/make_vision_fixture.py) keeps llama.cpp's
token ids, logits after the prompt, and greedy continuation; the test recomputes edgellm's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from edgellm.testing.synthetic.mmproj import tiny_png, write_tiny_mmproj
from edgellm.testing.synthetic.models import write_tiny_model

N_EMBD = 64
PROMPT = "Look at <__media__> and say"  # one image, text on both sides
N_GREEDY = 6
N_CTX = 256


# an image past the first 64-token sliding window: its tokens' windows reach back before the image
LATE_PROMPT = "x " * 40 + PROMPT
# fixture name -> (the mmproj's matrix type, the prompt)
CASES = {
    "gemma3": (np.float32, PROMPT),
    "gemma3_f16": (np.float16, PROMPT),
    "gemma3_late": (np.float32, LATE_PROMPT),
}


def write_case(tmp: Path, name: str = "gemma3") -> tuple[Path, Path, bytes]:
    """(text model, mmproj, PNG bytes) in tmp. The PNG is 40 x 24: resized and padded to 32 x 32. The
    mmproj's matrices are CASES[name] (F16: what real mmproj files hold, clip.cpp's f16 matmuls)."""
    # window 64: PROMPT's image (positions < 46) lies inside the first window, LATE_PROMPT's does not
    model = write_tiny_model(tmp / "gemma3.gguf", "gemma3", qtypes="F32", n_embd=N_EMBD, tied=False,
                             sliding_window=64, context_length=N_CTX, seed=3)  # fmt: skip
    mmproj = write_tiny_mmproj(tmp / f"mmproj_{name}.gguf", N_EMBD, seed=4, dtype=CASES[name][0])
    return model, mmproj, tiny_png(40, 24, seed=5)


def digest(*paths_or_bytes: Path | bytes) -> str:
    h = hashlib.sha256()
    for x in paths_or_bytes:
        h.update(x if isinstance(x, bytes) else Path(x).read_bytes())
    return h.hexdigest()
