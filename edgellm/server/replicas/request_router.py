"""The Ray Serve request router of the engine replicas: prefix affinity (prefix_router.py) on top of Ray
Serve's own replica set, queue-length cache and backoff. It runs inside the ingress process, in the
deployment handle that sends requests to the replicas; the ingress passes each request's block hashes as
the `prefix_hashes` keyword argument."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from edgellm.server.replicas import prefix_router
from edgellm.server.replicas.prefix_router import BusyRule, PrefixAffinity

CHOSEN_TTL_S = 60.0  # a choice never routed (its caller gone) stops counting toward load after this

# Ray ships this class to the ingress pickled by value, globals and all: state the ingress reads lives in
# prefix_router (imported by reference) and is reached through the module.


def _hashes(pending: PendingRequest | None) -> list[int]:
    if pending is None:
        return []
    hashes = pending.kwargs.get("prefix_hashes")
    return hashes if isinstance(hashes, list) else []


class PrefixAwareRequestRouter(RequestRouter):
    def initialize_state(self, max_margin: int = 4, max_blocks: int = 1 << 20):
        self.affinity = PrefixAffinity(BusyRule(max_margin=max_margin), max_blocks)
        self._sent: Counter[str] = Counter()  # replica -> requests this router has in flight there
        self._where: dict[str, str] = {}  # internal request id -> replica, once routed
        # Chosen but not routed yet (a burst is chosen before any of it is sent): internal request id ->
        # (replica, request); dropped by on_request_routed, or once cancelled, failed or stale.
        self._chosen: dict[str, tuple[str, PendingRequest]] = {}

    def _loads(self, replicas: list[RunningReplica]) -> dict[str, int]:
        """Requests in flight on each replica: its own count as last seen by Ray (all routers' requests)
        or this router's if higher (exact for ours, never stale), plus those chosen for it meanwhile."""
        now = time.time()
        for req_id, (_, pending) in list(self._chosen.items()):
            fut = pending.future
            # A future with a replica stays counted until on_request_routed moves it to _sent: between
            # the two, a request counted nowhere let a burst's second prefix land on the first's replica.
            gone = fut.done() and (fut.cancelled() or fut.exception() is not None)
            if gone or now - pending.created_at > CHOSEN_TTL_S:
                del self._chosen[req_id]
        chosen = Counter(replica for replica, _ in self._chosen.values())
        loads = {}
        for r in replicas:
            rid = r.replica_id.unique_id
            seen = self.replica_queue_len_cache.get(r.replica_id) or 0
            loads[rid] = max(seen, self._sent[rid]) + chosen[rid]
        return loads

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # a full replica set: back off
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        loads = self._loads(candidate_replicas)
        hashes = _hashes(pending_request)
        choice = self.affinity.choose(hashes, loads)
        prefix_router.DECISIONS[choice.reason if hashes else "no_prompt"] += 1
        # Recorded now as well as when routed: a burst sharing a new prefix follows the first request
        # instead of racing it, and counts toward its replica's load.
        self.affinity.record(hashes, choice.replica)
        if pending_request is not None:
            self._chosen[pending_request.metadata.internal_request_id] = (choice.replica, pending_request)
        first = by_id[choice.replica]
        rest = sorted(
            (r for r in candidate_replicas if r is not first), key=lambda r: loads[r.replica_id.unique_id]
        )
        return [[first], rest] if rest else [[first]]  # the rest only if `first` refuses (its queue is full)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        rid = replica_id.unique_id
        self._chosen.pop(pending_request.metadata.internal_request_id, None)
        self.affinity.record(_hashes(pending_request), rid)
        self._sent[rid] += 1
        self._where[pending_request.metadata.internal_request_id] = rid

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        rid = self._where.pop(internal_request_id, replica_id.unique_id)
        if self._sent[rid] > 0:
            self._sent[rid] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._drop(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        gone = set(self.curr_replicas) - {r.replica_id for r in replicas}
        super().update_replicas(replicas)
        for replica_id in gone:
            self._drop(replica_id.unique_id)

    def _drop(self, rid: str) -> None:
        self.affinity.forget(rid)
        self._sent.pop(rid, None)
