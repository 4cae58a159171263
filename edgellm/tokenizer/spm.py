"""SentencePiece-style ('llama' model) tokenization with llama.cpp's semantics (Gemma 3, Llama 2).

llama.cpp's SPM session splits a fragment into UTF-8 characters, then repeatedly merges the adjacent pair
whose concatenation is a vocabulary token with the highest score (ties: leftmost), and finally emits each
symbol's id, resegmenting symbols that are not tokens and falling back to <0xNN> byte tokens. That is the
same algorithm as SentencePiece's BPE model, so the fast path hands the work to the `sentencepiece`
library with a ModelProto built from the GGUF vocabulary. One difference remains: SentencePiece never forms
BYTE or UNKNOWN pieces by merging, while llama.cpp looks every merge up in the full vocabulary; fragments
that contain such a piece's text go through `spm_tokenize_ref`, a direct port of llama.cpp's loop.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from edgellm.tokenizer.vocab import TYPE_BYTE, TYPE_UNKNOWN, TokenizerError

SPACE_ESCAPE = "\u2581"  # SentencePiece's visible space, "▁"
_SMALL_VARINTS = [bytes([value]) for value in range(128)]


def spm_tokenize_ref(
    text: str, id_by_text: dict[str, int], scores: Sequence[float], byte_ids: Sequence[int]
) -> list[int]:
    """llama.cpp's llm_tokenizer_spm_session::tokenize on an already space-escaped fragment."""
    n = len(text)
    if n == 0:
        return []
    starts = list(range(n))
    lengths = [1] * n
    prev = list(range(-1, n - 1))
    nxt = list(range(1, n)) + [-1]
    heap: list[tuple[float, int, int, int]] = []
    rev_merge: dict[str, tuple[int, int]] = {}

    def try_add_bigram(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        size = lengths[left] + lengths[right]
        piece = text[starts[left] : starts[left] + size]
        tid = id_by_text.get(piece)
        if tid is None:
            return
        # heapq is a min-heap: negate the score so the best pair comes first, ties go to the leftmost.
        heapq.heappush(heap, (-scores[tid], left, right, size))
        rev_merge[piece] = (left, right)

    for i in range(1, n):
        try_add_bigram(i - 1, i)
    while heap:
        _, left, right, size = heapq.heappop(heap)
        if lengths[left] == 0 or lengths[right] == 0 or lengths[left] + lengths[right] != size:
            continue
        lengths[left] = size
        lengths[right] = 0
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        try_add_bigram(prev[left], left)
        try_add_bigram(left, nxt[left])

    output: list[int] = []

    def resegment(index: int) -> None:
        piece = text[starts[index] : starts[index] + lengths[index]]
        tid = id_by_text.get(piece)
        if tid is not None:
            output.append(tid)
            return
        split = rev_merge.get(piece)
        if split is None:
            output.extend(byte_ids[b] for b in piece.encode("utf-8"))
            return
        resegment(split[0])
        resegment(split[1])

    i = 0
    while i != -1:
        resegment(i)
        i = nxt[i]
    return output


def _serialized_model_proto(tokens: Sequence[str], scores: np.ndarray, proto_types: np.ndarray) -> bytes:
    """A SentencePiece ModelProto, serialized by hand: building 262k protobuf messages costs ~0.4 s."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    def varint(value: int) -> bytes:
        if value < 128:
            return _SMALL_VARINTS[value]
        out = bytearray()
        while True:
            byte = value & 0x7F
            value >>= 7
            if value:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                return bytes(out)

    score_bytes = scores.astype("<f4").tobytes()
    parts: list[bytes] = []
    for i, token in enumerate(tokens):
        raw = token.encode("utf-8")
        # SentencePiece fields: 1 piece (string), 2 score (float), 3 type (enum, default NORMAL omitted).
        body = b"\x0a" + varint(len(raw)) + raw + b"\x15" + score_bytes[4 * i : 4 * i + 4]
        if proto_types[i] != 1:
            body += b"\x18" + varint(int(proto_types[i]))
        parts.append(b"\x0a" + varint(len(body)) + body)
    model = pb.ModelProto()
    model.trainer_spec.model_type = pb.TrainerSpec.BPE
    model.trainer_spec.vocab_size = len(tokens)
    model.trainer_spec.byte_fallback = True
    model.normalizer_spec.name = "identity"
    model.normalizer_spec.add_dummy_prefix = False
    model.normalizer_spec.remove_extra_whitespaces = False
    model.normalizer_spec.escape_whitespaces = True
    # Repeated fields concatenate on parse, so the hand-built pieces can simply precede the rest.
    return b"".join(parts) + model.SerializeToString()


class SpmModel:
    """Encodes raw-text fragments (special tokens already split out) into ids, llama.cpp's SPM way."""

    def __init__(
        self, tokens: Sequence[str], scores: np.ndarray, token_types: np.ndarray, unknown_id: int | None
    ) -> None:
        self._tokens = tokens
        self._scores = scores.astype(np.float32).tolist()
        self.id_by_text: dict[str, int] = {}
        for tid, text in enumerate(tokens):
            self.id_by_text.setdefault(text, tid)
        self.byte_ids: list[int] = []
        for byte in range(256):
            tid = self.id_by_text.get(f"<0x{byte:02X}>")
            if tid is None:
                # llama.cpp would throw from byte_to_token on the first unknown character.
                tid = self.id_by_text.get(bytes([byte]).decode("latin-1"), -1)
            self.byte_ids.append(tid)
        missing = [f"<0x{b:02X}>" for b, tid in enumerate(self.byte_ids) if tid < 0]
        if missing:  # every fragment would need a byte this vocabulary cannot spell: refuse it at load
            shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
            raise TokenizerError(
                f"tokenizer.ggml.tokens: the SentencePiece vocabulary lacks {len(missing)} of the 256 "
                f"byte-fallback tokens ({shown}); text cannot be encoded without them"
            )
        # SentencePiece needs exactly one UNKNOWN piece; Gemma types its <unk> as CONTROL, so fall back to
        # the metadata's unknown id.
        unknown_ids = np.nonzero(token_types == TYPE_UNKNOWN)[0]
        if len(unknown_ids) == 1:
            unknown_id = int(unknown_ids[0])
        elif len(unknown_ids) > 1 or unknown_id is None or not 0 <= unknown_id < len(tokens):
            unknown_id = None
        proto_types = np.where(token_types == TYPE_BYTE, TYPE_BYTE, 1)
        if unknown_id is not None:
            proto_types[unknown_id] = TYPE_UNKNOWN
        # Texts that SentencePiece cannot form by merging but llama.cpp can: send those fragments to the ref.
        self._unmergeable_texts = [tokens[i] for i in np.nonzero(proto_types != 1)[0]]
        # All byte pieces and the usual "<unk>" contain "<": a fragment without one skips the scan.
        self._unmergeable_need_lt = all("<" in t for t in self._unmergeable_texts)
        self._processor = self._build_processor(tokens, scores, proto_types, unknown_id)

    def _build_processor(
        self, tokens: Sequence[str], scores: np.ndarray, proto_types: np.ndarray, unknown_id: int | None
    ):
        # SentencePiece needs unique, non-empty pieces, one UNKNOWN and a full set of byte pieces.
        if (
            unknown_id is None
            or len(self.id_by_text) != len(tokens)
            or "" in self.id_by_text
            or any(proto_types[tid] != TYPE_BYTE for tid in self.byte_ids)
        ):
            return None
        import sentencepiece

        # Everything but UNKNOWN and BYTE is NORMAL in the proto, so merges may form control and
        # user-defined pieces, as llama.cpp's plain vocabulary lookup does.
        processor = sentencepiece.SentencePieceProcessor()
        processor.LoadFromSerializedProto(_serialized_model_proto(tokens, scores, proto_types))
        if processor.GetPieceSize() != len(tokens):
            raise TokenizerError("sentencepiece rejected the GGUF vocabulary")
        return processor

    def encode_fragment(self, text: str) -> list[int]:
        """Ids for one raw fragment; the caller has already added any space prefix."""
        if not text:
            return []
        needs_ref = ("<" in text or not self._unmergeable_need_lt) and any(
            t in text for t in self._unmergeable_texts
        )
        if self._processor is None or needs_ref:
            escaped = text.replace(" ", SPACE_ESCAPE)
            return spm_tokenize_ref(escaped, self.id_by_text, self._scores, self.byte_ids)
        return self._processor.encode(text)

    def piece_bytes(self, tid: int, token_type: int) -> bytes:
        """llama.cpp token_to_piece for NORMAL and BYTE tokens ("▁" back to space; <0xNN> to its byte)."""
        text = self._tokens[tid]
        if token_type == TYPE_BYTE:
            return bytes([int(text[3:5], 16)])
        return text.replace(SPACE_ESCAPE, " ").encode("utf-8")

