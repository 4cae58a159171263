"""Per-sequence draft length from what a draft token costs and how likely it is to be accepted.

Cost: verifying k drafts makes the forward pass score k more query tokens. At batch 1 the weights stream once
whatever the count, so a draft costs a fraction VERIFY_COST of a one-token step (scripts/profile/spec_costs.py
prints this curve: ~0.15 on the CPU backend), plus what proposing it costs (nothing for n-gram lookup; a draft
model's forward pass, shared by the batch's sequences). With B sequences decoding, a step already scores B
tokens, costing about 1 + VERIFY_COST * (B - 1) one-token steps, that over B per token it yields; a draft pays
off when its chance of acceptance exceeds its cost over that: the break-even chance.

Chance: drafts are accepted as a chain (the j-th counts only if all before it were), so each sequence keeps
a running estimate of the chance that its next draft is accepted given the ones before it were (accepted
drafts over accepted drafts plus rejections, as a moving average over its verify steps). The j-th draft is
proposed only while that chance to the power j beats the break-even, and with B sequences decoding each
gets k_max // B at most (at least 1): a forward pass much larger than the batch costs more per token than
this linear model says (16 in flight were faster at k = 1 than at k = 8). On top of that k grows by doubling
while whole drafts are accepted and falls to what was accepted after a rejection (copied text comes in runs),
and speculation pauses, with exponential back-off, while the chance is under the break-even, so text that is
not copied from the context decodes at the non-speculative speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

VERIFY_COST = 0.15  # verifying one more draft, in one-token forward passes at batch 1 (CPU, measured)
DECAY = 0.5  # weight of the older verify steps in the running acceptance estimate
PAUSE_STEPS = (4, 256)  # first pause, longest pause (steps of that sequence), doubling in between
PRIOR = (1.0, 0.25)  # a new (or resumed) sequence's running (accepted, rejections): a chance of 0.8


@dataclass
class _State:
    k: int
    accepted: float = PRIOR[0]  # moving sums over this sequence's verify steps
    rejected: float = PRIOR[1]
    pause: int = 0  # steps left without speculation
    next_pause: int = PAUSE_STEPS[0]

    @property
    def chance(self) -> float:
        """Estimated chance that a draft is accepted given the drafts before it were."""
        return self.accepted / (self.accepted + self.rejected)


def break_even(batch: int, propose_cost: float = 0.0, verify_cost: float = VERIFY_COST) -> float:
    """The acceptance chance above which one more draft token pays for itself, with `batch` sequences
    decoding in the step. propose_cost: a draft token's own cost at batch 1 (a draft model's forward pass,
    which the batch's sequences share), in one-token target forward passes."""
    b = max(1, batch)
    return min(1.0, (verify_cost * b + propose_cost) / (1 + verify_cost * (b - 1)))


class AdaptiveK:
    def __init__(self, k_max: int, enabled: bool = True, propose_cost: float = 0.0) -> None:
        self.k_max, self.enabled, self.propose_cost = k_max, enabled, propose_cost
        self._states: dict[int, _State] = {}
        self.pauses = 0  # times a sequence's speculation was paused
        # With a draft model, a new sequence starts with the latest pause given (0 once a whole draft is
        # accepted): its first proposal costs a prefill of its prompt on the draft, not worth paying per
        # request to relearn that the drafts miss. N-gram drafts cost nothing until the text has a match.
        self._start_pause = 0

    def _state(self, seq_id: int) -> _State:
        st = self._states.get(seq_id)
        if st is None:
            p = self._start_pause
            nxt = min(PAUSE_STEPS[1], max(PAUSE_STEPS[0], 2 * p))
            st = self._states[seq_id] = _State(self.k_max, pause=p, next_pause=nxt)
        return st

    def k_for(self, seq_id: int, batch: int = 1) -> int:
        """Drafts to ask for this step (0: paused) when `batch` sequences decode in it. Counts a paused
        step."""
        if not self.enabled:
            return self.k_max
        st = self._state(seq_id)
        if st.pause > 0:
            st.pause -= 1
            return 0
        # The batch's drafts share about k_max verify tokens: past that, a larger forward pass costs more per
        # token than the linear cost model says (measured: 16 in flight do better at k = 1 than at k = 8).
        share = max(1, self.k_max // max(1, batch))
        return min(st.k, self._worth(st.chance, batch), share)

    def _worth(self, chance: float, batch: int) -> int:
        """The most drafts whose every member still has a better chance than the break-even."""
        floor = break_even(batch, self.propose_cost)
        if chance >= 1.0:
            return self.k_max
        if chance <= floor:
            return 0
        return min(self.k_max, max(1, int(math.log(floor) / math.log(chance))))

    def update(self, seq_id: int, proposed: int, accepted: int, batch: int = 1) -> None:
        if not self.enabled or proposed <= 0:
            return
        st = self._state(seq_id)
        rejected = accepted < proposed
        st.accepted = DECAY * st.accepted + accepted
        st.rejected = DECAY * st.rejected + rejected
        st.k = max(1, accepted + 1) if rejected else min(self.k_max, st.k * 2)
        if st.chance <= break_even(batch, self.propose_cost):
            st.pause, st.next_pause = st.next_pause, min(PAUSE_STEPS[1], st.next_pause * 2)
            st.accepted, st.rejected = PRIOR  # a fresh start after the pause
            self.pauses += 1
            if self.propose_cost > 0:
                self._start_pause = st.pause
        elif not rejected:
            st.next_pause = PAUSE_STEPS[0]
            self._start_pause = 0

    def drop(self, seq_id: int) -> None:
        self._states.pop(seq_id, None)
