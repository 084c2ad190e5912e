"""`kvcore demo --batch`'s workload: its options, the chats it serves (and their branches, one
per sequence), and the oracle every logit is checked against (kvcore_demo.batch tells the demo).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvcore_demo import footprint
from kvcore_demo.early_exit import EarlyExitDrafter
from kvcore_demo.model import Model
from kvcore_demo.options import DTYPE_BYTES, ModelOptions, kv_dtype
from kvcore_demo.trees import draft_layers

Array = npt.NDArray[Any]


@dataclasses.dataclass(frozen=True)
class BatchDemoOptions(ModelOptions):
    """Knobs of ``kvcore demo --batch`` (defaults: the default run)."""

    chats: int = 12
    #: Sequences in flight at once (a forking chat needs `samples` of them).
    concurrency: int = 8
    #: System prompt tokens every chat starts with.
    shared_len: int = 32
    #: Each chat's own prompt after the system prompt: between half and all of it.
    prompt_len: int = 16
    #: Tokens each chat (each sample) generates: between half and all of it.
    gen_len: int = 32
    #: Mean steps between two arrivals (0: every chat arrives at step 0, before any block is cached).
    arrive_every: int = 3
    #: Samples of a forking chat (1: no forks).
    samples: int = 3
    #: Every Nth chat from chat 1 on forks: 1, 1 + N, 1 + 2N, ... (0: none).
    fork_every: int = 4
    #: Draft tokens per speculative step (at most max_step - 1).
    draft: int = 3
    #: Every Nth chat from chat 2 on decodes speculatively: 2, 2 + N, ... (0: none).
    draft_every: int = 3
    #: Draft tree nodes per step of every chat, drafted by early exit (0: no trees; else 2 .. max_step).
    tree: int = 0
    block_size: int = 8
    window: int = 16
    max_step: int = 8

    def check(self) -> None:
        """Raises ValueError naming the first bad option."""
        at_least = {
            "chats": 1, "concurrency": 1, "shared_len": 0, "prompt_len": 1, "gen_len": 1, "arrive_every": 0,
            "samples": 1, "fork_every": 0, "draft": 0, "draft_every": 0, "tree": 0, "block_size": 1, "layers": 1,
            "flat_every": 0, "window": 1, "sinks": 0, "max_step": 1,
        }
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)}: must be >= {low}")
        if self.samples > self.concurrency:
            raise ValueError(
                f"--samples = {self.samples}: a forking chat needs that many sequences at once, "
                f"more than --concurrency = {self.concurrency}"
            )
        if self.samples > self.vocab_size:
            raise ValueError(f"--samples = {self.samples}: at most the vocabulary ({self.vocab_size})")
        self.check_tree(self.tree)
        # With trees --draft does not apply (and cannot be given): its default must not refuse a run.
        longest = "--tree" if self.tree else "--draft"
        self.check_step(self.capacity, 0 if self.tree else self.draft,
                        f"--shared-len + --prompt-len + --gen-len + {longest} + 1")
        self.check_dtype()
        least = [("concurrency", self.samples), ("prompt_len", 1), ("shared_len", 0), ("gen_len", 1), ("chats", 1)]
        footprint.check_options_fit(self, least, "each sequence in flight keeps its own oracle")

    def bytes_needed(self) -> int:
        """About the most bytes the run holds at once (kvcore_demo.footprint): one
        oracle per sequence in flight (and the system prompt's), a finished
        sequence's full recomputation, one step's attention over the live rows, the
        pool, every chat's tokens and, with trees, the drafters' caches."""
        cfg = self.model_config()
        n, c = self.capacity, self.concurrency
        rows = c * -(-n // self.block_size) * self.block_size  # live rows of a group, at most
        step = c * self.max_step
        fp = footprint
        oracle = fp.kv_bytes(cfg, n, cfg.n_layers) + fp.logits_bytes(cfg, n)
        final = fp.attention_bytes(cfg, n, n) + oracle + fp.activation_bytes(cfg, n)
        forward = fp.attention_bytes(cfg, step, rows) + fp.activation_bytes(cfg, step) + fp.logits_bytes(cfg, step)
        pool = 2 * fp.kv_bytes(cfg, rows, cfg.n_layers, DTYPE_BYTES[self.dtype])  # grown by doubling
        tokens = self.chats * n * self.samples * 2 * fp.TOKEN_BYTES
        # --tree: each sequence in flight has an early-exit drafter's cache (a quarter of the layers).
        drafters = c * fp.kv_bytes(cfg, n, draft_layers(cfg), DTYPE_BYTES[self.dtype]) if self.tree else 0
        return fp.weights_bytes(cfg) + (c + 2) * oracle + max(final, forward) + pool + tokens + drafters

    @property
    def capacity(self) -> int:
        """Longest sequence: system prompt, own prompt, generated tokens and one step of drafts (a tree with --tree)."""
        return self.shared_len + self.prompt_len + self.gen_len + (self.tree or self.draft) + 1


class Oracle:
    """``Model.forward_full`` of one token sequence, computed incrementally.

    ``logits(tokens)`` returns ``forward_full(tokens, kv_dtype)`` (every position)
    while keeping, per layer, the K/V of every position of the longest prefix it
    has computed before: only the positions from the first token that differs are
    computed, by ``Model.forward_from`` (``forward_full``'s own loop, resumed at that
    position: each position attends over all positions before it through
    ``visibility_mask``). Nothing here comes from kvcore's cache or pools.
    """

    def __init__(self, model: Model, capacity: int, kv_dtype: npt.DTypeLike = np.float32) -> None:
        c = model.config
        self.model = model
        self.kv_dtype = kv_dtype
        self.tokens: list[int] = []
        self.k = [np.zeros((capacity, c.n_kv_heads, c.head_dim), np.float32) for _ in range(c.n_layers)]
        self.v = [np.zeros((capacity, c.n_kv_heads, c.head_dim), np.float32) for _ in range(c.n_layers)]
        self.rows = np.zeros((capacity, c.vocab_size), np.float32)
        #: Positions computed so far (the cost of the oracle).
        self.work = 0

    def copy(self) -> Oracle:
        other = Oracle.__new__(Oracle)
        other.model, other.kv_dtype, other.tokens = self.model, self.kv_dtype, list(self.tokens)
        other.k = [a.copy() for a in self.k]
        other.v = [a.copy() for a in self.v]
        other.rows = self.rows.copy()
        other.work = 0
        return other

    def logits(self, tokens: Sequence[int]) -> Array:
        """forward_full(tokens): (len(tokens), vocab), a view valid until the next call."""
        n = 0
        limit = min(len(tokens), len(self.tokens))
        while n < limit and self.tokens[n] == tokens[n]:
            n += 1
        new = list(tokens[n:])
        if len(tokens) > len(self.rows):
            raise ValueError(f"{len(tokens)} tokens: the oracle holds at most {len(self.rows)}")
        self.tokens = list(tokens[:n]) + new
        if new:
            self._extend(n, new)
        return self.rows[: len(tokens)]

    def release(self) -> None:
        """Frees the K/V and logits kept so far (a finished sequence needs them no
        more); ``work`` stays. The oracle is empty after it."""
        self.tokens = []
        self.k, self.v = [], []
        self.rows = self.rows[:0]

    def _extend(self, start: int, new: list[int]) -> None:
        end = start + len(new)
        self.rows[start:end] = self.model.forward_from(new, start, self.k, self.v, self.kv_dtype)
        self.work += len(new)


@dataclasses.dataclass
class Chat:
    """One request: its prompt (system prompt + its own), what it generates, its role."""

    index: int
    arrival: int
    prompt: list[int]
    gen_len: int
    samples: int
    drafts: bool
    joined: int = -1
    left: int = -1
    hit: int = 0
    seq_ids: list[int] = dataclasses.field(default_factory=list)
    branches: list[Branch] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Branch:
    """One sequence of a chat: the chat itself, or one of its forked samples."""

    chat: Chat
    sample: int
    seq: int
    tokens: list[int]
    oracle: Oracle
    #: Logits of the committed positions this sequence (or the one it forked from) computed.
    kept: dict[int, Array] = dataclasses.field(default_factory=dict)
    #: The next token to feed: generated, not in the cache yet.
    pending: int = -1
    generated: list[int] = dataclasses.field(default_factory=list)
    done: bool = False
    #: Its early-exit drafter (--tree), made at its first tree step.
    drafter: EarlyExitDrafter | None = None

    @property
    def prefilling(self) -> bool:
        return len(self.tokens) < len(self.chat.prompt)


def make_chats(opts: BatchDemoOptions) -> list[Chat]:
    """The run's chats, in arrival order, from the seed."""
    rng = np.random.default_rng(opts.seed + 1)
    vocab, B = opts.vocab_size, opts.block_size
    shared = rng.integers(0, vocab, size=opts.shared_len).tolist()
    chats = []
    arrival = 0
    for i in range(opts.chats):
        if i and opts.arrive_every:
            arrival += int(rng.integers(1, 2 * opts.arrive_every))  # 1 .. 2N - 1 steps: N on average
        own = int(rng.integers(max(1, opts.prompt_len // 2), opts.prompt_len + 1))
        forks = opts.samples > 1 and opts.fork_every > 0 and i >= 1 and (i - 1) % opts.fork_every == 0
        if forks and own > 1 and (opts.shared_len + own) % B == 0:
            own -= 1  # end the prompt inside a block: the samples share it partly filled (copy-on-write)
        drafts = opts.draft > 0 and opts.draft_every > 0 and i >= 2 and (i - 2) % opts.draft_every == 0
        chats.append(
            Chat(
                index=i,
                arrival=arrival,
                prompt=shared + rng.integers(0, vocab, size=own).tolist(),
                gen_len=int(rng.integers(max(1, opts.gen_len // 2), opts.gen_len + 1)),
                samples=opts.samples if forks else 1,
                drafts=drafts,
            )
        )
    return chats
