"""A prompt with images as libmtmd tokenizes it (mtmd.cpp's mtmd_tokenizer): the text split at each media
marker, every text part tokenized on its own (no BOS, special tokens parsed), each image as the
projector's begin text, its embeddings' positions, its end text; BOS first when the vocabulary adds one.
The image positions hold a placeholder token id; the engine replaces their rows with the embeddings
(engine/protocol.py's MediaSpan), and the prefix cache keys them by the image's content hash."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass

from edgellm.engine.protocol import MediaSpan
from edgellm.vision.image import MAX_IMAGE_BYTES, ImageError
from edgellm.vision.mmproj import VisionEncoder

MEDIA_MARKER = "<__media__>"  # mtmd_default_marker(): where an image goes in the prompt's text
MAX_IMAGES = 16  # per request: each costs an encoder pass and its tokens of context


@dataclass
class PreparedPrompt:
    """A prompt with its images already encoded (the server encodes off the event loop, then sends it)."""

    token_ids: list[int]
    media: list[MediaSpan]

    def __len__(self) -> int:  # what the APIs count as the prompt's tokens (usage, input_tokens)
        return len(self.token_ids)


def decode_data_url(url: str) -> bytes:
    """The bytes of a base64 image data URL (data:image/png;base64,...). ImageError for anything else:
    http(s) URLs are not fetched."""
    if not isinstance(url, str) or not url.startswith("data:"):
        raise ImageError("only data URLs (data:image/...;base64,...) are supported for images")
    head, sep, payload = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise ImageError("an image data URL must be base64-encoded (data:image/...;base64,...)")
    return decode_base64(payload)


def decode_base64(payload: str) -> bytes:
    if not isinstance(payload, str) or len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ImageError(f"an image must be a base64 string of at most {MAX_IMAGE_BYTES} bytes decoded")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"the image is not valid base64: {e}") from None


def image_prompt(
    tok, encoder: VisionEncoder | None, text: str, images: Sequence[bytes], add_special: bool = True
) -> tuple[list[int], list[MediaSpan]]:
    """(token ids, one MediaSpan per image) for text whose MEDIA_MARKERs stand for the images, in order;
    a count mismatch is an ImageError, as it is mtmd_tokenize's error."""
    if encoder is None:
        raise ImageError("this model takes no images (start it with an mmproj file: --mmproj / mmproj=)")
    parts = text.split(MEDIA_MARKER)
    if len(parts) - 1 != len(images):
        raise ImageError(f"{len(parts) - 1} media markers in the prompt for {len(images)} images")
    if len(images) > MAX_IMAGES:
        raise ImageError(f"{len(images)} images in one request; at most {MAX_IMAGES}")
    proj = encoder.projector
    ids: list[int] = [tok.bos_id] if add_special and tok.add_bos and tok.bos_id is not None else []
    spans: list[MediaSpan] = []
    placeholder = tok.bos_id if tok.bos_id is not None else 0  # any valid id: its row is replaced
    for i, part in enumerate(parts):
        ids += tok.encode(part, add_special=False, parse_special=True)
        if i == len(images):
            break
        if proj.begin:
            ids += tok.encode(proj.begin, add_special=False, parse_special=True)
        embeds, key = encoder.encode_bytes(images[i])
        spans.append(MediaSpan(len(ids), embeds, key, proj.non_causal))
        ids += [placeholder] * len(embeds)
        if proj.end:
            ids += tok.encode(proj.end, add_special=False, parse_special=True)
    return ids, spans
