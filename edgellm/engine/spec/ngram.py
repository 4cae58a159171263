"""Prompt-lookup (n-gram) proposer: the tokens that followed the latest earlier occurrence of the sequence's
last n tokens (n from n_max down to n_min), in its prompt and output so far. No model, no KV: it guesses
well exactly where text is copied from the context (code being edited, quoted passages, JSON keys)."""

from __future__ import annotations

from edgellm.engine.sequence import Sequence


class _Index:
    """Per sequence: for each n, n-gram -> the position just after its latest occurrence."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.by_n: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}
        self.upto = 0  # n-grams ending at positions <= upto are indexed

    def extend(self, tokens: list[int], end: int) -> None:
        """Index the n-grams ending at positions upto+1 .. end (exclusive of the live suffix's own end)."""
        for e in range(self.upto + 1, end + 1):
            for n, table in self.by_n.items():
                if e >= n:
                    table[tuple(tokens[e - n : e])] = e
        self.upto = max(self.upto, end)


class NgramProposer:
    cost = 0.0  # a lookup, next to a forward pass

    def __init__(self, n_min: int, n_max: int) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes need 1 <= n_min <= n_max, got {n_min}..{n_max}")
        self.n_min, self.n_max = n_min, n_max
        self._index: dict[int, _Index] = {}

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[list[int]]:
        """Up to k draft tokens for each (sequence, k)."""
        return [self._one(seq, k) for seq, k in requests]

    def _one(self, seq: Sequence, k: int) -> list[int]:
        tokens = seq.token_ids
        n_tok = len(tokens)
        idx = self._index.get(seq.seq_id)
        if idx is None:
            idx = self._index[seq.seq_id] = _Index(self.n_min, self.n_max)
        # Earlier occurrences only: the suffix itself (ending at n_tok) is indexed on a later call.
        idx.extend(tokens, n_tok - 1)
        if k <= 0:
            return []
        for n in range(min(self.n_max, n_tok - 1), self.n_min - 1, -1):
            start = idx.by_n[n].get(tuple(tokens[n_tok - n :]))
            if start is not None:
                return tokens[start : start + k]
        return []

    def drop(self, seq_id: int) -> None:
        self._index.pop(seq_id, None)
