"""The KV-aware router (``Router``: each request to the replica whose cached prefix is longest,
against its load; round-robin and least-loaded as baselines) and ``Cluster``, which runs
requests through a store, replicas and a router."""

from __future__ import annotations

from typing import Any, Sequence

from kvcore._core import block_keys
from kvcore._errors import InvalidArgumentError, InvalidStateError
from kvcore.cluster.checks import positive
from kvcore.cluster.replica import BlockKey, Build, Reply, Request, start_replicas
from kvcore.cluster.store import StoreStats, start_store
from kvcore.tier import Namespace, Tokens, namespace_id, token_ids

POLICIES = ("kv", "round_robin", "least_loaded")


class Router:
    """Chooses a replica for each request. ``policy``: ``"kv"`` scores each replica ``local +
    store_weight x max(store - local, 0) - alpha x running`` (tokens; ``local`` the prompt's
    prefix the replica's reported keys hold, ``store`` the store's prefix, ``running`` the
    replica's requests in flight) and takes the highest, ties to fewer running, then fewer requests
    sent so far, then the lowest index; ``"round_robin"`` cycles; ``"least_loaded"`` takes the
    fewest running (ties as kv's).
    ``decisions`` counts requests sent to each replica, ``peak_running`` each one's most in flight.

    InvalidArgumentError: replicas or block_size < 1, an unknown policy, alpha or store_weight
    negative or not a number."""

    def __init__(self, replicas: int, block_size: int, *, policy: str = "kv", alpha: float = 16.0,
                 store_weight: float = 0.5) -> None:
        self.replicas = positive(replicas, "Router: replicas")
        self.block_size = positive(block_size, "Router: block_size")
        if policy not in POLICIES:
            raise InvalidArgumentError(f"Router: policy = {policy!r}: must be one of {', '.join(POLICIES)}")
        for name, value in (("alpha", alpha), ("store_weight", store_weight)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise InvalidArgumentError(f"Router: {name} = {value!r}: must be a number >= 0")
        self.policy, self.alpha, self.store_weight = policy, float(alpha), float(store_weight)
        self.running = [0] * replicas
        self.decisions = [0] * replicas
        self.peak_running = [0] * replicas
        self._held: list[frozenset[BlockKey]] = [frozenset()] * replicas
        self._next = 0

    def update(self, replica: int, held: frozenset[BlockKey]) -> None:
        """Replaces what `replica` is known to hold (a Reply's ``held``)."""
        self._held[self._index(replica)] = frozenset(held)

    def local(self, replica: int, tokens: Tokens, namespace: Namespace = None) -> int:
        """The prefix of `tokens` (positions, at most len - 1) whose full blocks `replica` reported."""
        held = self._held[self._index(replica)]
        ns = namespace_id(namespace)
        ids = token_ids(tokens, "Router.local")
        usable = max(len(ids) - 1, 0) // self.block_size
        n = 0
        for lo, hi in block_keys(ids[: usable * self.block_size], self.block_size, ns):
            if (ns, int(lo), int(hi)) not in held:
                break
            n += 1
        return n * self.block_size

    def choose(self, tokens: Tokens, namespace: Namespace = None, store: int = 0) -> int:
        """The replica for a prompt (`store`: the store's prefix of it, positions); counts the
        decision and one more running request there (``finished`` takes it back)."""
        if self.policy == "round_robin":
            r = self._next
            self._next = (self._next + 1) % self.replicas
        elif self.policy == "least_loaded":
            r = min(range(self.replicas), key=lambda i: (self.running[i], self.decisions[i], i))
        else:
            def score(i: int) -> tuple[float, int, int, int]:
                local = self.local(i, tokens, namespace)
                gain = local + self.store_weight * max(store - local, 0) - self.alpha * self.running[i]
                return (-gain, self.running[i], self.decisions[i], i)
            r = min(range(self.replicas), key=score)
        self.decisions[r] += 1
        self.running[r] += 1
        self.peak_running[r] = max(self.peak_running[r], self.running[r])
        return r

    def finished(self, replica: int) -> None:
        """One request of `replica` finished. InvalidStateError: it has none running."""
        r = self._index(replica)
        if self.running[r] == 0:
            raise InvalidStateError(f"Router.finished: replica {r} has no request running")
        self.running[r] -= 1

    def balance(self) -> float:
        """max / mean of the decisions per replica (1.0: even; 0.0 before any)."""
        total = sum(self.decisions)
        return 0.0 if total == 0 else max(self.decisions) * self.replicas / total

    def _index(self, replica: int) -> int:
        if isinstance(replica, bool) or not isinstance(replica, int) or not 0 <= replica < self.replicas:
            raise InvalidArgumentError(f"Router: replica = {replica!r}: must be an int in [0, {self.replicas})")
        return replica


class Cluster:


    """A store actor, `replicas` Replica actors and a Router in this (driver) process, on the
    running Ray instance. ``run`` serves a list of requests, at most `max_in_flight` at a time
    (routing each as it is sent, with the replicas' reports so far); ``shutdown`` ends the
    actors. InvalidArgumentError: a bad count or size, or the Router's."""

    def __init__(self, build: Build, replicas: int, *, block_size: int, store_bytes: int, host_bytes: int,
                 policy: str = "kv", alpha: float = 16.0, store_weight: float = 0.5, max_in_flight: int = 0) -> None:
        self.router = Router(replicas, block_size, policy=policy, alpha=alpha, store_weight=store_weight)
        self.max_in_flight = positive(max_in_flight, "Cluster: max_in_flight", 0) or 2 * replicas
        positive(host_bytes, "Cluster: host_bytes", 0)
        self.store = start_store(store_bytes)
        self.replicas = start_replicas(replicas, build, self.store, host_bytes)

    def run(self, requests: Sequence[Request]) -> list[Reply]:
        """Serves `requests` (each routed when it is sent); the replies in the requests' order.
        Raises what a replica raises."""
        import ray

        pending = list(requests)[::-1]
        flying: dict[Any, int] = {}
        replies: dict[int, Reply] = {}
        while pending or flying:
            while pending and len(flying) < self.max_in_flight:
                req = pending.pop()
                ids = token_ids(list(req.tokens), "Cluster.run")
                ns = namespace_id(req.namespace)
                usable = max(len(ids) - 1, 0) // self.router.block_size
                keys = [(int(lo), int(hi)) for lo, hi in
                        block_keys(ids[: usable * self.router.block_size], self.router.block_size, ns)]
                store = int(ray.get(self.store.longest.remote(ns, self.router.block_size, keys))) if keys else 0
                r = self.router.choose(ids, ns, store)
                flying[self.replicas[r].serve.remote(req)] = r
            done, _ = ray.wait(list(flying), num_returns=1)
            r = flying.pop(done[0])
            self.router.finished(r)
            reply: Reply = ray.get(done[0])
            self.router.update(r, reply.held)
            replies[reply.rid] = reply
        return [replies[req.rid] for req in requests]

    def store_stats(self) -> StoreStats:
        """The store's counters."""
        import ray

        stats: StoreStats = ray.get(self.store.stats.remote())
        return stats

    def shutdown(self) -> None:
        """Ends the replica and store actors (their objects go with the store)."""
        import ray

        for actor in [*self.replicas, self.store]:
            ray.kill(actor)
        self.replicas = []
