"""`kvcore demo --batch`'s serving loop (``BatchServer``): admission, steps, forks, drafts and
trees through ``BatchCache`` + ``PagedKVPool``, every step checked against the chats' oracles,
and the report of what it measured (kvcore_demo.batch tells the demo).
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from typing import Any

import numpy as np

import kvcore
from kvcore_demo.batch_chats import Array, BatchDemoOptions, Branch, Chat, Oracle, make_chats
from kvcore_demo.drafts import accepted_prefix, corrupt_drafts, greedy
from kvcore_demo.early_exit import EarlyExitDrafter
from kvcore_demo.model import Model
from kvcore_demo.options import TOLERANCE, kv_dtype, model_summary
from kvcore_demo.runner import Progress
from kvcore_demo.trees import accepted_path, draft_layers, root_paths, tree_step

#: A begin_step entry: (seq, T, tokens) for a chain, (seq, T, tokens, parents) for a tree.
Entry = tuple[int, int, list[int]] | tuple[int, int, list[int], list[int]]


class BatchServer:
    """The serving loop of one run (``run``) and what it measures (``report``)."""

    def __init__(self, opts: BatchDemoOptions, bar: Progress) -> None:
        self.opts = opts
        self.bar = bar
        self.dtype = kv_dtype(opts.dtype)
        self.tolerance = TOLERANCE[opts.dtype]
        self.model = Model(opts.model_config())
        cfg = self.model.config
        self.max_step = opts.max_step
        limits = kvcore.BatchLimits(block_size=opts.block_size, max_seqs=opts.concurrency)
        self.cache = kvcore.BatchCache(cfg.cache_config(opts.capacity, self.max_step, batch=limits))
        self.pool = kvcore.PagedKVPool(self.cache, self.dtype)
        self.row_bytes = 2 * cfg.n_kv_heads * cfg.head_dim * np.dtype(self.dtype).itemsize
        self.group_layers = [0] * self.cache.n_groups
        for layer in range(cfg.n_layers):
            self.group_layers[self.cache.group_of(layer)] += 1
        self.ring_groups = [g for g in range(self.cache.n_groups) if self.cache.group_policy(g).is_ring]
        self.rng = np.random.default_rng(opts.seed + 2)

        self.chats = make_chats(opts)
        self.queue = list(self.chats)
        self.free: list[int] = list(range(opts.concurrency))
        self.used_ids: set[int] = set()
        self.active: list[Branch] = []
        # The system prompt's oracle, computed once: every chat's oracle starts from a copy.
        self.base = Oracle(self.model, opts.capacity, self.dtype)
        shared = self.chats[0].prompt[: opts.shared_len]
        if shared:
            self.base.logits(shared)

        self.clock = 0
        self.steps = 0
        self.tokens_prefill = self.tokens_decode = 0
        self.forward_s = self.cache_s = self.oracle_s = self.draft_s = 0.0
        self.peak_sequences = 0
        self.joined_mid_run = self.left_mid_run = self.ids_reused = self.waited = 0
        self.hits = self.full_hits = self.hit_tokens = self.lookups = 0
        self.forks = self.fork_samples = self.cow_copies = 0
        self.spec_steps = self.drafted = self.accepted = self.rewinds = self.rewound = 0
        self.tree_steps = self.tree_nodes = self.tree_tokens = self.tree_copies = self.off_main = 0
        self.draft_forwards = 0
        self.greedy_tokens = self.not_greedy = 0
        self.step_diff = 0.0
        self.step_positions = 0
        self.final_diff = 0.0
        self.final_positions = 0
        self.final_work = 0
        #: What forward_full of each chat's whole sequence at every step would have computed.
        self.per_step_full_work = 0
        self.mismatches: list[str] = []
        self.first_failure: dict[str, Any] | None = None
        self.peak: dict[str, int] = {"kv_bytes": -1}
        self.ring_released_peak = 0

    # -- the loop ----------------------------------------------------------------

    def run(self) -> None:
        while self.queue or self.active:
            self._admit()
            if not self.active:  # nobody in flight: the next chat has not arrived yet
                self.clock = self.queue[0].arrival
                continue
            self._step()
            self.clock += 1
            done = sum(c.left >= 0 for c in self.chats)
            self.bar.update("serving", done, len(self.chats))

    def _admit(self) -> None:
        while self.queue and self.queue[0].arrival <= self.clock and len(self.free) >= self.queue[0].samples:
            chat = self.queue.pop(0)
            seq = self._take_id()
            chat.joined = self.clock
            if self.active and self.steps > 0:  # into a batch in flight
                self.joined_mid_run += 1
            if self.clock > chat.arrival:
                self.waited += 1
            t0 = time.perf_counter()
            self.cache.add_sequence(seq)
            chat.hit = self.cache.adopt_prefix(seq, chat.prompt)
            self.cache_s += time.perf_counter() - t0
            self.lookups += 1
            if chat.hit:
                self.hits += 1
                self.hit_tokens += chat.hit
                if chat.hit >= self.opts.shared_len // self.opts.block_size * self.opts.block_size:
                    self.full_hits += 1
            # The samples' ids are held from the start, so the fork never waits.
            chat.seq_ids = [seq] + [self._take_id() for _ in range(chat.samples - 1)]
            branch = Branch(chat=chat, sample=0, seq=seq, tokens=chat.prompt[: chat.hit], oracle=self.base.copy())
            chat.branches.append(branch)
            self.active.append(branch)
            self._agree(branch, "after adopt_prefix")

    def _take_id(self) -> int:
        seq = heapq.heappop(self.free)
        if seq in self.used_ids:
            self.ids_reused += 1
        self.used_ids.add(seq)
        return seq

    def _entries(self) -> tuple[list[Entry], list[list[int]], list[list[int] | None]]:
        """The step's entries (a prefill chunk, a decode step with drafts, or a tree per
        sequence in flight), each one's token ids, and each one's parents (None: a chain)."""
        C = self.max_step
        entries: list[Entry] = []
        fed: list[list[int]] = []
        trees: list[list[int] | None] = []  # each entry's parents, None for a chain
        for b in self.active:
            parents = None
            if b.prefilling:
                ids = b.chat.prompt[len(b.tokens) : len(b.tokens) + C]
                self.tokens_prefill += len(ids)
            elif self.opts.tree:
                parents, ids = self._tree(b)
                self.tokens_decode += len(ids)
            else:
                k = min(self.opts.draft, b.chat.gen_len - len(b.generated)) if b.chat.drafts else 0
                ids = [b.pending, *self._drafts(b, k)]
                self.tokens_decode += len(ids)
            entries.append((b.seq, len(ids), ids) if parents is None else (b.seq, len(ids), ids, parents))
            fed.append(ids)
            trees.append(parents)
        return entries, fed, trees

    def _step(self) -> None:
        entries, fed, trees = self._entries()
        tokens = [t for ids in fed for t in ids]

        t0 = time.perf_counter()
        step = self.cache.begin_step(entries)
        plan = step.plan()
        first = plan.first_positions.copy()
        starts = plan.query_starts.copy()
        copies = sum(int(g.copies.shape[0]) for g in plan.groups)
        logits = self.model.forward_batch(tokens, step, self.pool)
        paths = {b.seq: accepted_path(parents, ids, logits[int(starts[i]) : int(starts[i + 1])])
                 for i, (b, ids, parents) in enumerate(zip(self.active, fed, trees)) if parents is not None}
        if paths:  # the chains (prefill chunks) commit whole
            moved = step.commit(accepted=list(paths.items()))
            self.pool.apply_copies(moved)
            self.tree_copies += sum(int(m.shape[0]) for m in moved)
        else:
            step.commit()
        self.forward_s += time.perf_counter() - t0
        self.steps += 1
        self.cow_copies += copies
        self.peak_sequences = max(self.peak_sequences, len(self.active))
        self._measure_bytes()

        forking: list[tuple[Branch, Array]] = []
        for i, (b, ids) in enumerate(zip(self.active, fed)):
            P = len(b.tokens)
            if int(first[i]) != P:
                self._mismatch(f"step {self.steps}: chat {b.chat.index} sample {b.sample} starts at {first[i]}, not {P}")
            rows = logits[int(starts[i]) : int(starts[i + 1])]
            self._check_step(b, ids, rows, trees[i])
            if b.prefilling:
                b.tokens.extend(ids)
                b.kept.update({P + j: rows[j] for j in range(len(ids))})
                if not b.prefilling:
                    if b.chat.samples > 1:
                        forking.append((b, rows[-1]))
                    else:
                        b.pending = greedy(rows[-1])
                        b.generated.append(b.pending)
            elif trees[i] is not None:
                self._accept_tree(b, ids, rows, P, paths[b.seq])
            else:
                self._accept(b, ids, rows, P)
        for b, last in forking:
            self._fork(b, last)
        for b in [b for b in self.active if not b.prefilling and len(b.generated) >= b.chat.gen_len]:
            self._release(b)
        for b in self.active:
            self._agree(b, f"after step {self.steps}")

    def _drafts(self, b: Branch, k: int) -> list[int]:
        """k guesses: the oracle's greedy continuation, one token corrupted at a random place (or none)."""
        if k == 0:
            return []
        t0 = time.perf_counter()
        seq = [*b.tokens, b.pending]
        for _ in range(k):
            seq.append(greedy(b.oracle.logits(seq)[-1]))
        drafts = corrupt_drafts(seq[len(b.tokens) + 1 :], self.rng, self.opts.vocab_size)
        self.oracle_s += time.perf_counter() - t0
        return drafts

    def _tree(self, b: Branch) -> tuple[list[int], list[int]]:
        """(parents, tokens) of b's next tree step, from its own early-exit drafter."""
        if b.drafter is None:
            b.drafter = EarlyExitDrafter(self.model, draft_layers(self.model.config), self.opts.capacity, self.max_step,
                                         self.dtype)
        t0 = time.perf_counter()
        out = tree_step(b.drafter, [*b.tokens, b.pending], self.opts.tree, b.chat.gen_len - len(b.generated))
        self.draft_s += time.perf_counter() - t0
        return out

    def _keep(self, b: Branch, ids: list[int], rows: Array, P: int, path: list[int]) -> None:
        """Appends the accepted root path's tokens and logit rows to b (position P on),
        then the greedy token after them as the next to feed."""
        b.tokens.extend(ids[n] for n in path)
        b.kept.update({P + d: rows[n] for d, n in enumerate(path)})
        b.generated.extend(ids[n] for n in path[1:])
        b.pending = greedy(rows[path[-1]])
        b.generated.append(b.pending)

    def _accept_tree(self, b: Branch, ids: list[int], rows: Array, P: int, path: list[int]) -> None:
        self._keep(b, ids, rows, P, path)
        self.tree_steps += 1
        self.tree_nodes += len(ids)
        self.tree_tokens += len(path)  # the accepted drafts and the token after them
        self.off_main += path != list(range(len(path)))

    def _accept(self, b: Branch, ids: list[int], rows: Array, P: int) -> None:
        k = len(ids) - 1
        a = accepted_prefix(ids[1:], rows)
        self._keep(b, ids, rows, P, list(range(a + 1)))
        if k:
            self.spec_steps += 1
            self.drafted += k
            self.accepted += a
        if a < k:
            t0 = time.perf_counter()
            self.cache.rewind(b.seq, P + 1 + a)
            self.cache_s += time.perf_counter() - t0
            self.rewinds += 1
            self.rewound += k - a

    def _fork(self, src: Branch, last: Array) -> None:
        chat = src.chat
        ranked = np.argsort(-last, kind="stable")
        src.pending = int(ranked[0])
        src.generated.append(src.pending)
        for j, seq in enumerate(chat.seq_ids[1:], start=1):
            t0 = time.perf_counter()
            self.cache.fork(src.seq, seq)
            self.cache_s += time.perf_counter() - t0
            b = Branch(chat=chat, sample=j, seq=seq, tokens=list(src.tokens), oracle=src.oracle.copy(),
                       kept=dict(src.kept), pending=int(ranked[j]))
            b.generated.append(b.pending)
            chat.branches.append(b)
            self.active.append(b)
        self.forks += 1
        self.fork_samples += chat.samples

    def _release(self, b: Branch) -> None:
        b.done = True
        b.generated = b.generated[: b.chat.gen_len]
        t0 = time.perf_counter()
        ref = self.model.forward_full(b.tokens, kv_dtype=self.dtype)
        for p, row in b.kept.items():
            d = float(np.abs(row - ref[p]).max())
            self.final_diff = max(self.final_diff, d)
            if not d <= self.tolerance and self.first_failure is None:
                self.first_failure = {"check": "final", "chat": b.chat.index, "sample": b.sample, "position": p,
                                      "diff": d, "step": self.steps}
        self.final_positions += len(b.kept)
        self._check_greedy(b, ref)
        if b.drafter is not None:
            self.draft_forwards += b.drafter.forwards
            b.drafter = None
        self.final_work += len(b.tokens)
        # What the checks kept is done with: a long run holds only the sequences in flight.
        b.kept = {}
        b.oracle.release()
        self.oracle_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        self.cache.release_sequence(b.seq)
        self.cache_s += time.perf_counter() - t0
        heapq.heappush(self.free, b.seq)
        self.active.remove(b)
        chat = b.chat
        if all(x.done for x in chat.branches) and len(chat.branches) == chat.samples:
            chat.left = self.clock
            if self.active or self.queue:
                self.left_mid_run += 1

    # -- checks and measures -----------------------------------------------------

    def _check_step(self, b: Branch, ids: list[int], rows: Array, parents: list[int] | None) -> None:
        """Every row against b's full recomputation: a chain's after b's tokens, a tree
        node's after b's tokens and the node's root path (one oracle call per leaf)."""
        t0 = time.perf_counter()
        P = len(b.tokens)
        for path in root_paths(parents, len(ids)):
            ref = b.oracle.logits([*b.tokens, *(ids[n] for n in path)])[P:]
            self.per_step_full_work += P + len(path)
            diff = np.abs(rows[path] - ref).max(axis=-1)
            worst = float(diff.max())
            self.step_diff = max(self.step_diff, worst)
            if not worst <= self.tolerance and self.first_failure is None:
                j = int(np.argmax(~(diff <= self.tolerance)))
                self.first_failure = {"check": "step", "chat": b.chat.index, "sample": b.sample, "position": P + j,
                                      "diff": float(diff[j]), "step": self.steps}
        self.step_positions += len(ids)
        self.oracle_s += time.perf_counter() - t0

    def _check_greedy(self, b: Branch, ref: Array) -> None:
        """Every token b generated is plain greedy decoding's: the argmax of the full
        recomputation `ref` at the position before it, up to the dtype's tolerance
        (a 16-bit near-tie may go either way). A forked sample's first token is its
        j-th choice, not checked."""
        seq = [*b.tokens, b.pending]
        first = len(b.chat.prompt) - (b.sample == 0)
        for p in range(first, len(seq) - 1):
            self.greedy_tokens += 1
            if ref[p, seq[p + 1]] < ref[p].max() - self.tolerance:
                self.not_greedy += 1

    def _agree(self, b: Branch, when: str) -> None:
        """The cache's length of the sequence is the chat's own count of its tokens."""
        n = self.cache.length(b.seq)
        if n != len(b.tokens):
            self._mismatch(f"{when}: chat {b.chat.index} sample {b.sample} (sequence {b.seq}) "
                           f"has length {n} in the cache, {len(b.tokens)} tokens in the chat")

    def _mismatch(self, what: str) -> None:
        self.mismatches.append(what)

    def _measure_bytes(self) -> None:
        B = self.cache.block_size
        held = self.pool.nbytes
        no_sharing = all_flat = released = 0
        n_layers = self.model.config.n_layers
        for b in self.active:
            L = self.cache.length(b.seq)
            all_flat += L * self.row_bytes * n_layers
            for g, layers in enumerate(self.group_layers):
                blocks = self.cache.blocks_held(b.seq, g)
                no_sharing += blocks * B * self.row_bytes * layers
                if g in self.ring_groups:
                    released += -(-L // B) - blocks
        self.ring_released_peak = max(self.ring_released_peak, released)
        if held > self.peak["kv_bytes"]:
            self.peak = {"kv_bytes": held, "no_sharing_bytes": no_sharing, "all_flat_bytes": all_flat,
                         "step": self.steps, "sequences": len(self.active)}

    # -- the report --------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        cfg = self.model.config
        tol = self.tolerance
        all_done = all(c.left >= 0 for c in self.chats)
        checks = [
            {
                "name": "every step's logits equal each chat's own full recomputation",
                "ok": self.step_diff <= tol and self.steps > 0,
                "detail": f"max |diff| {self.step_diff:.2e} over {self.step_positions} new positions "
                          f"in {self.steps} steps, tolerance {tol:.0e}",
            },
            {
                "name": "each finished sequence's kept logits equal forward_full of its whole sequence",
                "ok": self.final_diff <= tol and all_done,
                "detail": f"max |diff| {self.final_diff:.2e} over {self.final_positions} positions of "
                          f"{sum(len(c.branches) for c in self.chats)} sequences"
                          + ("" if all_done else ", NOT every chat finished"),
            },
            {
                "name": "the cache's lengths and positions agree with every chat's tokens",
                "ok": not self.mismatches,
                "detail": "after every admission, step, rewind and fork" if not self.mismatches
                          else f"{len(self.mismatches)} disagreements, first: {self.mismatches[0]}",
            },
            {
                "name": "every generated token is plain greedy decoding's (the full recomputation's argmax)",
                "ok": self.not_greedy == 0 and all_done,
                "detail": f"{self.greedy_tokens - self.not_greedy}/{self.greedy_tokens} tokens",
            },
        ]
        generated = sum(len(b.generated) for c in self.chats for b in c.branches)
        fed = self.tokens_prefill + self.tokens_decode
        return {
            "ok": all(bool(c["ok"]) for c in checks),
            "checks": checks,
            "first_failure": self.first_failure,
            "model": model_summary(cfg),
            "options": dataclasses.asdict(self.opts),
            "dtype": self.opts.dtype,
            "max_step": self.max_step,
            "block_size": self.cache.block_size,
            "capacity": self.opts.capacity,
            "steps": self.steps,
            "tokens": {"prefill": self.tokens_prefill, "decode": self.tokens_decode, "total": fed,
                       "generated": generated},
            "tokens_per_s": fed / max(self.forward_s, 1e-9),
            "generated_tokens_per_s": generated / max(self.forward_s + self.cache_s, 1e-9),
            "seconds": {"forward": self.forward_s, "cache": self.cache_s, "oracle": self.oracle_s,
                        "draft": self.draft_s},
            "chats": {
                "total": len(self.chats),
                "sequences": sum(len(c.branches) for c in self.chats),
                "concurrency": self.opts.concurrency,
                "peak_sequences": self.peak_sequences,
                "joined_mid_run": self.joined_mid_run,
                "left_mid_run": self.left_mid_run,
                "waited": self.waited,
                "ids_reused": self.ids_reused,
                "finished": sum(c.left >= 0 for c in self.chats),
            },
            "prefix": {"shared_len": self.opts.shared_len, "lookups": self.lookups, "hits": self.hits,
                       "full_hits": self.full_hits, "tokens_reused": self.hit_tokens},
            "forks": {"forks": self.forks, "samples": self.fork_samples, "copy_on_write_blocks": self.cow_copies},
            "speculative": {"steps": self.spec_steps, "drafted": self.drafted, "accepted": self.accepted,
                            "rewinds": self.rewinds, "rewound_tokens": self.rewound},
            "trees": {"size": self.opts.tree, "steps": self.tree_steps, "nodes": self.tree_nodes,
                      "tokens": self.tree_tokens, "tokens_per_forward": self.tree_tokens / max(self.tree_steps, 1),
                      "paths_off_main_line": self.off_main, "copies": self.tree_copies,
                      "draft_layers": draft_layers(self.model.config) if self.opts.tree else 0,
                      "draft_forwards": self.draft_forwards},
            "kv": {
                "peak_bytes": self.peak["kv_bytes"],
                "peak_no_sharing_bytes": self.peak.get("no_sharing_bytes", 0),
                "peak_all_flat_bytes": self.peak.get("all_flat_bytes", 0),
                "peak_step": self.peak.get("step", 0),
                "peak_sequences": self.peak.get("sequences", 0),
                "reserved_bytes": self.pool.reserved_bytes,
                "ring_blocks_released_peak": self.ring_released_peak,
            },
            "oracle": {
                "max_abs_logit_diff": self.step_diff,
                "final_max_abs_logit_diff": self.final_diff,
                "tolerance": tol,
                "positions_checked": self.step_positions,
                "positions_computed": self.base.work + sum(b.oracle.work for c in self.chats for b in c.branches),
                "positions_per_step_forward_full": self.per_step_full_work,
                "positions_final": self.final_positions,
                "positions_computed_final": self.final_work,
            },
            "per_chat": [
                {
                    "chat": c.index, "arrival": c.arrival, "joined": c.joined, "left": c.left,
                    "prompt_len": len(c.prompt), "prefix_hit": c.hit, "samples": c.samples, "drafts": c.drafts,
                    "sequence_ids": c.seq_ids, "generated": [b.generated for b in c.branches],
                }
                for c in self.chats
            ],
        }
