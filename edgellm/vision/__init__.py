"""Image input: llama.cpp's mmproj files (tools/mtmd/ of the vendored llama.cpp), one projector type per
file. mmproj.py reads and validates the file and picks the projector's module; image.py decodes and
preprocesses an image as libmtmd does; prompt.py places each image's embeddings in the prompt with the
projector's begin/end tokens. The encoder runs in the front-end process (numpy + the CPU backend's Numba
kernels); the engine receives each image as rows of embeddings (engine/protocol.py's MediaSpan)."""

from edgellm.vision.mmproj import VisionEncoder, load_mmproj

__all__ = ["VisionEncoder", "load_mmproj"]
