"""vLLM's own KVCacheManager on the workloads of bench/batch_bench.cpp, driven the
way vLLM's scheduler (vllm/v1/core/sched/scheduler.py) drives it. Prints JSON.

Run it with the interpreter of a venv holding vLLM 0.33 (CPU, bookkeeping only):

    bash ../shared/peers/install_vllm_cpu.sh /tmp/vllm-venv
    /tmp/vllm-venv/bin/python bench/vllm_manager.py [--quick] [--out PATH]

bench/batch_compare.py runs it alternately with kvcore_bench and compares.

Shape: Gemma-3-27B (62 layers, 16 KV heads x 128, bfloat16): ten full-attention
layers and 52 sliding-window layers (W = 1024); block size 16; prefix caching on
(sha256 block hashes, vLLM's default); one block pool shared by the groups,
20,000 blocks per group.
`--groups brief` (default): one full-attention group and one sliding-window
group, as kvcore groups them. `--groups vllm`: the groups vLLM's own planner
(_get_kv_cache_groups_uniform_page_size) makes of the 62 layers: one full group
and six sliding groups of ten layers each.

Workloads (the token ids are bench/batch_bench.cpp's):
  decode  N requests share a 2,000-token prompt (the first computes it, the others
          hit the prefix cache), decode 64 tokens, then timed decode steps; per
          step, as the scheduler: new_step_starts(); per request the previous
          step's sampled token is appended (append_output_token_ids, which
          hashes a block it fills), allocate_slots(request, 1), the step's
          block ids read (get_block_ids(allow_none=True)), num_computed_tokens
          advanced; then the per-step drains (take_boundary_state_offloads,
          take_kv_cache_block_copies, take_new_block_ids, take_events).
  admit   one request with that prompt while the first is still running:
          get_computed_blocks (1,984 tokens hit), allocate_slots for the 16 left,
          get_block_ids, num_computed_tokens set, free. Timed without and with
          building the Request (which hashes the prompt's blocks).
  ring    one request prefilled in chunks to a context, then 64 decode steps: the
          sliding-window group's blocks it holds (null blocks excluded).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time

import torch
import vllm
import vllm.v1.core.kv_cache_utils as U
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_planning import _get_kv_cache_groups_uniform_page_size
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        SlidingWindowSpec)
from vllm.v1.request import Request, RequestStatus

B = 16
WINDOW = 1024
N_LAYERS = 62
KV_HEADS, HEAD_DIM = 16, 128
BLOCKS_PER_GROUP = 20000  # the pool is shared by the groups: 20,000 per group
MAX_MODEL_LEN = 131072
PROMPT = 2000
WARM_DECODE = 64
LAYER_BLOCK_MIB = B * 2 * KV_HEADS * HEAD_DIM * 2 / 2**20  # K+V of one layer's block, bf16


def prompt_token(p: int) -> int:
    return 100 + p


def decode_token(seq: int, p: int) -> int:
    return 3000 + (seq * 131 + p) % 20000


def token_row(seq: int, length: int) -> list[int]:
    return [prompt_token(p) if p < PROMPT else decode_token(seq, p) for p in range(length)]


def is_full_layer(layer: int) -> bool:  # transformers' Gemma3 layer_types
    return (layer + 1) % 6 == 0


def make_groups(kind: str) -> list[KVCacheGroupSpec]:
    full = FullAttentionSpec(block_size=B, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                             dtype=torch.bfloat16)
    swa = SlidingWindowSpec(block_size=B, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                            dtype=torch.bfloat16, sliding_window=WINDOW)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(N_LAYERS)]
    if kind == "brief":
        return [KVCacheGroupSpec([n for i, n in enumerate(names) if is_full_layer(i)], full),
                KVCacheGroupSpec([n for i, n in enumerate(names) if not is_full_layer(i)], swa)]
    spec = {n: (full if is_full_layer(i) else swa) for i, n in enumerate(names)}
    return _get_kv_cache_groups_uniform_page_size(spec)


class Engine:
    """One KVCacheManager and the hasher the engine gives each Request."""

    def __init__(self, groups_kind: str):
        self.groups = make_groups(groups_kind)
        self.num_blocks = BLOCKS_PER_GROUP * len(self.groups)
        self.manager = KVCacheManager(
            KVCacheConfig(num_blocks=self.num_blocks, kv_cache_tensors=[],
                          kv_cache_groups=self.groups),
            max_model_len=MAX_MODEL_LEN, scheduler_block_size=B, hash_block_size=B,
            enable_caching=True)
        hash_fn = get_hash_fn_by_name("sha256")  # CacheConfig.prefix_caching_hash_algo default
        U.init_none_hash(hash_fn)
        self.hasher = U.get_request_block_hasher(B, hash_fn)
        self.managers = self.manager.coordinator.single_type_managers
        self.sliding = [isinstance(g.kv_cache_spec, SlidingWindowSpec) for g in self.groups]
        # A block of a group spans this many layers' pages (vLLM pads groups to one size).
        self.layers_per_block = [len(g.layer_names) for g in self.groups]
        if groups_kind == "vllm":  # its group size: the smaller layer count of the two kinds
            n_full = sum(is_full_layer(i) for i in range(N_LAYERS))
            size = min(n_full, N_LAYERS - n_full)
            self.layers_per_block = [size] * len(self.groups)

    def request(self, rid: str, tokens: list[int]) -> Request:
        return Request(rid, tokens, SamplingParams(max_tokens=MAX_MODEL_LEN - len(tokens)), None,
                       block_hasher=self.hasher)

    def admit(self, r: Request, chunk: int | None = None) -> int:
        """The scheduler's waiting-queue path: prefix lookup, then slots for the rest
        (in chunks of `chunk` tokens when given). Returns the hit length."""
        m = self.manager
        hit_blocks, n_hit, r.shared_prefix_boundary = m.get_computed_blocks(r)
        todo = r.num_tokens - n_hit
        first = todo if chunk is None else min(chunk, todo)
        blocks = m.allocate_slots(r, first, num_new_computed_tokens=n_hit,
                                  new_computed_blocks=hit_blocks, has_scheduled_reqs=True)
        assert blocks is not None, "admission refused"
        blocks.get_block_ids()
        r.status = RequestStatus.RUNNING
        r.num_computed_tokens = n_hit + first
        while r.num_computed_tokens < r.num_tokens:
            n = min(chunk, r.num_tokens - r.num_computed_tokens)
            blocks = m.allocate_slots(r, n)
            assert blocks is not None, "prefill chunk refused"
            blocks.get_block_ids(allow_none=True)
            r.num_computed_tokens += n
        return n_hit

    def decode_step(self, reqs: list[Request], rows: list[list[int]]) -> None:
        m = self.manager
        m.new_step_starts()
        for r, row in zip(reqs, rows):
            r.append_output_token_ids(row[r.num_tokens])
            blocks = m.allocate_slots(r, 1)
            if blocks is None:
                raise RuntimeError("decode step refused: pool exhausted")
            blocks.get_block_ids(allow_none=True)
            r.num_computed_tokens += 1
        m.take_boundary_state_offloads()
        m.take_kv_cache_block_copies()
        m.take_new_block_ids()
        m.take_events()

    # --- counting -------------------------------------------------------------
    def held(self, g: int, rid: str, below_block: int | None = None) -> list[int]:
        blocks = self.managers[g].req_to_blocks.get(rid, [])
        if below_block is not None:
            blocks = blocks[:below_block]
        return [b.block_id for b in blocks if not b.is_null]

    def blocks(self, reqs: list[Request]) -> dict:
        ids = [r.request_id for r in reqs]
        hit_blocks = (PROMPT - 1) // B
        per_group = [len({b for rid in ids for b in self.held(g, rid)}) for g in range(len(self.groups))]
        prompt = [len({b for rid in ids for b in self.held(g, rid, hit_blocks)})
                  for g in range(len(self.groups))]
        pool_in_use = self.num_blocks - 1 - self.manager.block_pool.get_num_free_blocks()
        full = [g for g, s in enumerate(self.sliding) if not s]
        swa = [g for g, s in enumerate(self.sliding) if s]
        return {
            "groups": ["sliding" if s else "full" for s in self.sliding],
            "per_group": per_group,
            "full": sum(per_group[g] for g in full),
            "sliding": sum(per_group[g] for g in swa),
            "total": sum(per_group),
            "pool_in_use": pool_in_use,
            "usage": self.manager.usage,
            "prompt_full": sum(prompt[g] for g in full),
            "prompt_sliding": sum(prompt[g] for g in swa),
            "sliding_held_max": max(max(len(self.held(g, rid)) for g in swa) for rid in ids),
            "kv_mib": sum(per_group[g] * self.layers_per_block[g] for g in range(len(self.groups)))
            * LAYER_BLOCK_MIB,
        }


def decode(groups_kind: str, n: int, steps: int, reps: int) -> dict:
    eng = Engine(groups_kind)
    rows = [token_row(i, PROMPT + WARM_DECODE + steps * reps + 1) for i in range(n)]
    reqs = [eng.request(f"r{i}", rows[i][:PROMPT]) for i in range(n)]
    hits = [eng.admit(r) for r in reqs]
    for _ in range(WARM_DECODE):
        eng.decode_step(reqs, rows)
    blocks = eng.blocks(reqs)
    times, cpu = [], []
    for _ in range(reps):
        t, c = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(steps):
            eng.decode_step(reqs, rows)
        cpu.append((time.thread_time_ns() - c) / 1e3 / (steps * n))
        times.append((time.perf_counter_ns() - t) / 1e3 / (steps * n))
    return {"seqs": n, "us_per_seq": statistics.median(times), "us_per_seq_reps": times,
            "cpu_us_per_seq": statistics.median(cpu), "cpu_us_per_seq_reps": cpu,
            "steps_per_rep": steps, "context": PROMPT + WARM_DECODE, "hits": sorted(set(hits)),
            "blocks": blocks}


def admit(groups_kind: str, count: int, reps: int) -> dict:
    eng = Engine(groups_kind)
    tokens = token_row(1, PROMPT)
    first = eng.request("seed", tokens)
    eng.admit(first)  # computes the prompt; stays running
    manager_us, with_request_us, manager_cpu, with_request_cpu = [], [], [], []
    hit = 0
    k = 0
    for _ in range(reps):
        only = only_cpu = 0
        for _ in range(count):  # Request built outside the timer (its hashes too)
            r = eng.request(f"a{k}", tokens)
            k += 1
            t, c = time.perf_counter_ns(), time.thread_time_ns()
            hit = eng.admit(r)
            eng.manager.free(r)
            only_cpu += time.thread_time_ns() - c
            only += time.perf_counter_ns() - t
        manager_us.append(only / 1e3 / count)
        manager_cpu.append(only_cpu / 1e3 / count)
        t, c = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(count):  # the Request's construction (prompt hashing) included
            r = eng.request(f"a{k}", tokens)
            k += 1
            eng.admit(r)
            eng.manager.free(r)
        with_request_cpu.append((time.thread_time_ns() - c) / 1e3 / count)
        with_request_us.append((time.perf_counter_ns() - t) / 1e3 / count)
    r = eng.request("last", tokens)
    eng.admit(r)
    return {"us_manager": statistics.median(manager_us), "us_manager_reps": manager_us,
            "cpu_us_manager": statistics.median(manager_cpu),
            "us_with_request": statistics.median(with_request_us),
            "cpu_us_with_request": statistics.median(with_request_cpu),
            "us_with_request_reps": with_request_us, "requests_per_rep": count,
            "hit_tokens": hit, "computed_tokens": PROMPT - hit, "blocks": eng.blocks([first, r])}


def ring(groups_kind: str, context: int, chunk: int) -> dict:
    eng = Engine(groups_kind)
    decoded = 64
    row = token_row(0, context + 1)
    r = eng.request("long", row[:context - decoded])
    swa = [g for g, s in enumerate(eng.sliding) if s]
    full = [g for g, s in enumerate(eng.sliding) if not s]

    def sliding_held() -> int:
        return max(len(eng.held(g, "long")) for g in swa)

    m = eng.manager
    held_max = 0
    hit_blocks, n_hit, r.shared_prefix_boundary = m.get_computed_blocks(r)
    first = min(chunk, r.num_tokens - n_hit)
    assert m.allocate_slots(r, first, num_new_computed_tokens=n_hit, new_computed_blocks=hit_blocks)
    r.status = RequestStatus.RUNNING
    r.num_computed_tokens = n_hit + first
    held_max = max(held_max, sliding_held())
    while r.num_computed_tokens < r.num_tokens:
        n = min(chunk, r.num_tokens - r.num_computed_tokens)
        assert m.allocate_slots(r, n) is not None
        r.num_computed_tokens += n
        held_max = max(held_max, sliding_held())
    for _ in range(decoded):
        eng.decode_step([r], [row])
        held_max = max(held_max, sliding_held())
    return {"context": r.num_computed_tokens, "chunk": chunk, "sliding_held": sliding_held(),
            "sliding_held_max": held_max, "full_held": max(len(eng.held(g, "long")) for g in full)}


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", choices=["brief", "vllm"], default="brief")
    ap.add_argument("--seqs", default="1,16,64,256")
    ap.add_argument("--steps", type=int, default=64, help="decode steps per timed repetition")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions (median)")
    ap.add_argument("--admit-count", type=int, default=40, help="admissions per repetition")
    ap.add_argument("--contexts", default="2048,8192,32768")
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--skip", default="", help="comma list of workloads to skip: decode,admit,ring")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.reps, args.admit_count, args.contexts = 4, 2, 3, "2048"
    skip = set(filter(None, args.skip.split(",")))
    gc.collect()
    out = {
        "peer": "vllm.v1.core.kv_cache_manager.KVCacheManager",
        "vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version(),
        "groups_kind": args.groups,
        "groups": [{"kind": "sliding" if isinstance(g.kv_cache_spec, SlidingWindowSpec) else "full",
                    "layers": len(g.layer_names)} for g in make_groups(args.groups)],
        "block_size": B, "window": WINDOW, "num_blocks_per_group": BLOCKS_PER_GROUP, "prompt": PROMPT,
        "loadavg_start": loadavg(),
    }
    if "decode" not in skip:
        out["decode"] = [decode(args.groups, int(n), args.steps, args.reps)
                         for n in args.seqs.split(",")]
    if "admit" not in skip:
        out["admit"] = admit(args.groups, args.admit_count, args.reps)
    if "ring" not in skip:
        out["ring"] = [ring(args.groups, int(c), args.prefill_chunk) for c in args.contexts.split(",")]
    out["loadavg_end"] = loadavg()
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    sys.exit(main())
