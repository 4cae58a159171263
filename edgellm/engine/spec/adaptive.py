"""Per-sequence draft length: grow k while drafts are accepted, shrink it to what was accepted, and pause
speculation (with exponential back-off) while acceptance is too low to pay for the verify tokens, so text
that is not copied from the context decodes at the non-speculative speed."""

from __future__ import annotations

from dataclasses import dataclass

EMA_WEIGHT = 0.3  # weight of the newest verify step in the acceptance average
OFF_BELOW = 0.25  # pause when the average acceptance falls below this
PAUSE_STEPS = (4, 256)  # first pause, longest pause (steps of that sequence), doubling in between


@dataclass
class _State:
    k: int
    rate: float = 0.5  # running acceptance (accepted / proposed) of this sequence's drafts
    pause: int = 0  # steps left without speculation
    next_pause: int = PAUSE_STEPS[0]


class AdaptiveK:
    def __init__(self, k_max: int, enabled: bool = True) -> None:
        self.k_max, self.enabled = k_max, enabled
        self._states: dict[int, _State] = {}

    def k_for(self, seq_id: int) -> int:
        """Drafts to ask for this step (0: paused). Counts a paused step."""
        if not self.enabled:
            return self.k_max
        st = self._states.setdefault(seq_id, _State(self.k_max))
        if st.pause > 0:
            st.pause -= 1
            return 0
        return st.k

    def update(self, seq_id: int, proposed: int, accepted: int) -> None:
        if not self.enabled or proposed <= 0:
            return
        st = self._states.setdefault(seq_id, _State(self.k_max))
        st.rate = (1 - EMA_WEIGHT) * st.rate + EMA_WEIGHT * accepted / proposed
        st.k = min(self.k_max, st.k * 2) if accepted == proposed else max(1, accepted + 1)
        if st.rate < OFF_BELOW:
            st.pause, st.next_pause = st.next_pause, min(PAUSE_STEPS[1], st.next_pause * 2)
            st.rate = 0.5  # a fresh start after the pause
        elif accepted == proposed:
            st.next_pause = PAUSE_STEPS[0]

    def drop(self, seq_id: int) -> None:
        self._states.pop(seq_id, None)
