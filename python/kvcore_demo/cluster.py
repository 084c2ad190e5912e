"""``kvcore demo --cluster``: conversations served by Ray replicas over a cluster record store.

A local Ray instance (or a cluster at ``address``) runs a ``kvcore.cluster.RecordStore`` actor
and ``replicas`` ``Replica`` actors, each its own ``BatchCache`` + ``PagedKVPool`` (room for
``device_seqs`` sequences' blocks) over a ``HostTier`` of ``host_records`` records' bytes, all
running the demo model (ring layers with a flat one every ``flat_every``). ``conversations``
chats share a system prompt; each has ``turns`` turns, a turn's prompt being the chat so far
(the previous prompt, its reply) and ``user_len`` new tokens. Turn after turn, every chat's next
request goes through the ``Router`` (policy ``kv``: cached prefix against load; ``round_robin``,
``least_loaded``): a replica restores the longest prefix its device, its host tier or the store
holds, computes the rest and generates ``gen_len`` tokens greedily, then publishes the record.

The driver then decodes every request alone in one process (``Decoder``, a ``SequenceCache``)
and checks every reply's tokens are equal and its logits agree within the dtype's tolerance.
The report gives the prompt tokens served by each tier (device, host, store) and computed, the
bytes moved from the store and host tiers, and the router's decisions per replica (balance =
max / mean). Needs the ``distributed`` extra (``pip install "kvcore[distributed]"``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import numpy as np
import numpy.typing as npt

import kvcore
from kvcore.cluster import POLICIES, Cluster, Forward, Request
from kvcore_demo.model import Decoder, Model
from kvcore_demo.options import TOLERANCE, ModelOptions, kv_dtype

Array = npt.NDArray[Any]


@dataclasses.dataclass(frozen=True)
class ClusterOptions(ModelOptions):
    """The demo's sizes (replicas, conversations, turns, tokens per system prompt, user turn and
    reply, rows per block, device room in sequences, host tier in records, store in records),
    its router (policy, alpha in tokens per running request) and, from ModelOptions, its model:
    ModelConfig's small shape (6 layers, window 16, no sinks, d_model 64)."""

    replicas: int = 2
    conversations: int = 6
    turns: int = 3
    system_len: int = 32
    user_len: int = 8
    gen_len: int = 4
    block_size: int = 8
    device_seqs: int = 1
    host_records: int = 6
    store_records: int = 64
    policy: str = "kv"
    alpha: float = 16.0
    #: A Ray cluster's address; None starts a local instance.
    address: Optional[str] = None
    layers: int = 6
    window: int = 16
    sinks: int = 0
    d_model: int = 64
    head_dim: int = 16
    d_ff: int = 128
    vocab_size: int = 256

    @property
    def capacity(self) -> int:
        """Longest sequence (positions): the system prompt, every turn's user tokens and replies."""
        return self.system_len + self.turns * (self.user_len + self.gen_len + 1) + 1

    def check(self) -> None:
        """Raises ValueError naming the first option the run cannot honour, before any Ray
        process starts (a value below its least, an unknown policy, alpha < 0, --max-step above
        the longest sequence, a dtype the model cannot compute in); kvcore.InvalidArgumentError
        when kvcore refuses a replica's cache."""
        at_least = {"replicas": 1, "conversations": 1, "turns": 1, "system_len": 0, "user_len": 1, "gen_len": 1,
                    "block_size": 1, "device_seqs": 1, "host_records": 0, "store_records": 0, "layers": 1,
                    "window": 1, "max_step": 1}
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)}: must be >= {low}")
        if self.policy not in POLICIES:
            raise ValueError(f"--policy = {self.policy}: must be one of {', '.join(POLICIES)}")
        if not self.alpha >= 0:
            raise ValueError(f"--alpha = {self.alpha}: must be >= 0")
        self.check_step(self.capacity, 0, "--system-len + --turns x (--user-len + --gen-len + 1) + 1")
        self.check_dtype()
        kv_dtype(self.dtype)
        self.model_config().cache_config(self.capacity, self.max_step, batch=self.limits())

    def limits(self) -> kvcore.BatchLimits:
        """A replica's BatchLimits: blocks of block_size rows, a pool for device_seqs sequences
        (one runs at a time; the rest of the pool keeps cached prefixes), one more id to import into."""
        return kvcore.BatchLimits(block_size=self.block_size, max_seqs=self.device_seqs + 1,
                                  max_active_seqs=self.device_seqs)

    def record_bytes(self) -> int:
        """An upper bound on one record's bytes (the longest sequence, every layer's rows)."""
        c = self.model_config()
        per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * np.dtype(kv_dtype(self.dtype)).itemsize + 4
        return self.capacity * per_token + 4096


def build_replica(opts: ClusterOptions) -> tuple[kvcore.BatchCache, Any, Forward]:
    """A replica's cache, pool and forward (the demo model's forward_batch), built in its process."""
    model = Model(opts.model_config())
    cache = kvcore.BatchCache(model.config.cache_config(opts.capacity, opts.max_step, batch=opts.limits()))
    pool = kvcore.PagedKVPool(cache, kv_dtype(opts.dtype))

    def forward(tokens: list[int], step: Any, pool: Any) -> Array:
        out: Array = model.forward_batch(tokens, step, pool)
        return out

    return cache, pool, forward


def reference(opts: ClusterOptions, prompt: list[int]) -> tuple[list[int], Array]:
    """One request decoded alone in this process: its tokens and the logits of its decode steps."""
    dec = Decoder(Model(opts.model_config()), opts.capacity, opts.max_step, kv_dtype(opts.dtype))
    tokens = [int(np.argmax(dec.feed(prompt)[-1]))]
    logits = []
    for _ in range(opts.gen_len):
        lg = dec.step([tokens[-1]])[-1]
        logits.append(lg)
        tokens.append(int(np.argmax(lg)))
    return tokens, np.stack(logits)


def run_cluster(opts: ClusterOptions) -> dict[str, Any]:
    """Runs the demo on Ray and checks it; a report (``ok`` False names what differed). Raises
    what ClusterOptions.check raises, before Ray starts."""
    import ray

    opts.check()
    rng = np.random.default_rng(opts.seed + 1)
    vocab = opts.vocab_size
    system = [int(t) for t in rng.integers(0, vocab, opts.system_len)]
    chats = [list(system) for _ in range(opts.conversations)]
    started = not ray.is_initialized()
    if started:
        ray.init(address=opts.address, num_cpus=None if opts.address else 2, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    requests: list[Request] = []
    replies = []
    try:
        cluster = Cluster(functools.partial(build_replica, opts), opts.replicas, block_size=opts.block_size,
                          store_bytes=opts.store_records * opts.record_bytes(),
                          host_bytes=opts.host_records * opts.record_bytes(), policy=opts.policy, alpha=opts.alpha)
        try:
            for turn in range(opts.turns):
                batch = []
                for i, chat in enumerate(chats):
                    chat += [int(t) for t in rng.integers(0, vocab, opts.user_len)]
                    batch.append(Request(turn * opts.conversations + i, tuple(chat), None, opts.gen_len))
                out = cluster.run(batch)
                for chat, reply in zip(chats, out):
                    chat += reply.tokens  # the reply (its last token not yet fed) joins the chat
                requests += batch
                replies += out
            stats = cluster.store_stats()
        finally:
            cluster.shutdown()
    finally:
        if started:
            ray.shutdown()
    problems = []
    for req, reply in zip(requests, replies):
        want_tokens, want_logits = reference(opts, list(req.tokens))
        if reply.tokens != want_tokens:
            problems.append(f"request {req.rid}: tokens differ from single-process decoding")
        elif not np.allclose(reply.logits, want_logits, atol=TOLERANCE[opts.dtype], rtol=0):
            problems.append(f"request {req.rid}: logits differ by {np.abs(reply.logits - want_logits).max():.3g}")
    prompt_tokens = sum(len(r.tokens) for r in requests)
    tiers = {t: sum(getattr(r, t) for r in replies) for t in ("device", "host", "store", "computed")}
    decisions = cluster.router.decisions
    return {
        "ok": not problems,
        "problems": problems,
        "replicas": opts.replicas,
        "requests": len(requests),
        "policy": opts.policy,
        "prompt_tokens": prompt_tokens,
        "reused": tiers,
        "store_bytes_moved": sum(r.store_bytes for r in replies),
        "host_bytes_moved": sum(r.host_bytes for r in replies),
        "refused": sum(r.refused for r in replies),
        "decisions": decisions,
        "balance": max(decisions) * len(decisions) / max(sum(decisions), 1),
        "store": dataclasses.asdict(stats),
    }


def format_report(r: dict[str, Any]) -> str:
    """The report as text."""
    n, t = r["prompt_tokens"], r["reused"]

    def share(k: str) -> str:
        return f"{t[k]} ({100 * t[k] / max(n, 1):.1f}%)"

    lines = [
        f"{r['requests']} requests on {r['replicas']} Ray replicas, router policy {r['policy']}",
        f"prompt tokens {n}: device {share('device')}, host tier {share('host')}, store {share('store')}, "
        f"computed {share('computed')}",
        f"bytes moved: store -> replicas {r['store_bytes_moved']}, host tiers -> devices {r['host_bytes_moved']} "
        f"(records from the store included); "
        f"records refused {r['refused']}",
        f"requests per replica {r['decisions']} (max/mean {r['balance']:.2f}); store holds {r['store']['records']} "
        f"records, {r['store']['bytes']} bytes, {r['store']['evictions']} evicted",
        "every reply equals single-process decoding" if r["ok"] else "MISMATCH: " + "; ".join(r["problems"]),
    ]
    return "\n".join(lines)
