"""Decoding an image (Pillow) and libmtmd's preprocessing of it: the fixed-size resize with centred padding
(mtmd-image.cpp's img_tool::resize, PAD_CEIL; its resampling is Pillow's, ported to C++), then
u8 / 255, then (x - mean) / std per channel (clip-impl.h's normalize)."""

from __future__ import annotations

import io
import math

import numpy as np

MAX_IMAGE_BYTES = 32 << 20  # an encoded image larger than this is refused before decoding
MAX_IMAGE_PIXELS = 40_000_000  # decoded size limit: a 6000 x 6000 photo passes, a decompression bomb does not


class ImageError(ValueError):
    """An image that cannot be used: not decodable, too large, or given to a model without vision."""


def decode_image(data: bytes) -> np.ndarray:
    """The image's RGB pixels [H, W, 3] uint8 (alpha dropped, palette expanded: stb_image's RGB, as
    mtmd_helper_bitmap_init_from_buf asks for). ImageError for anything Pillow cannot decode."""
    from PIL import Image  # the decoder: formats, palettes and EXIF-free pixels as libmtmd's stb_image

    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"image of {len(data)} bytes is larger than the {MAX_IMAGE_BYTES} byte limit")
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.width * im.height > MAX_IMAGE_PIXELS:
                raise ImageError(
                    f"image of {im.width}x{im.height} pixels is over the {MAX_IMAGE_PIXELS} limit"
                )
            rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except ImageError:
        raise
    except Exception as e:  # Pillow raises many types (UnidentifiedImageError, OSError, SyntaxError, ...)
        raise ImageError(f"cannot decode the image: {e}") from e
    if rgb.ndim != 3 or rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise ImageError("the image has no pixels")
    return rgb


def resize_padded(rgb: np.ndarray, width: int, height: int, resample: str) -> np.ndarray:
    """img_tool::resize with PAD_CEIL: scale to fit inside width x height keeping the aspect ratio (the
    sides rounded up), resample with Pillow's filter, centre on black. Same size: a copy, no resampling."""
    from PIL import Image

    h0, w0 = rgb.shape[:2]
    if (w0, h0) == (width, height):
        return rgb.copy()
    scale = min(np.float32(width) / np.float32(w0), np.float32(height) / np.float32(h0))  # float, as C++
    new_w = min(int(math.ceil(np.float32(w0) * scale)), width)
    new_h = min(int(math.ceil(np.float32(h0) * scale)), height)
    filt = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}[resample]
    resized = np.asarray(Image.fromarray(rgb).resize((new_w, new_h), filt), dtype=np.uint8)
    out = np.zeros((height, width, 3), np.uint8)
    ox, oy = (width - new_w) // 2, (height - new_h) // 2
    out[oy : oy + new_h, ox : ox + new_w] = resized
    return out


def normalize(rgb: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """[3, H, W] float32 planes: (u8 / 255 - mean) / std in float32, as clip_image_f32's from_u8 and
    normalize compute them."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    x = (x - mean.astype(np.float32)) / std.astype(np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))
