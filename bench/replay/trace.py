"""The Mooncake-format request trace: its requests (TraceRequest), reading, writing and
generating one, the token ids of prompts and sampled tokens, chained block fingerprints, and an
infinite cache's reuse of each prompt (trace_ideal).

Trace (Mooncake FAST'25 format, ../shared/traces/README.md): one JSON object per line with
`timestamp` (ms), `input_length`, `output_length` and `hash_ids` (512-token prefix blocks; the
last may be partial). Token ids: prompt position j of hash block h is `1 + 512 h + (j mod 512)`,
a bijection of (h, j) into [1, 2**30) (no two ids share a token); the k-th sampled token of
request r is `2**30 + (r * 1000003 + k) mod 2**30`, so no prompt ever contains it.
`generate_trace` makes seeded synthetic traces of the same format (shared system prompts,
multi-turn conversations whose prompts extend an earlier prompt of theirs, random lengths).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HASH_BLOCK = 512
PROMPT_ID_LIMIT = 1 << 30
DECODE_BASE = 1 << 30
DEFAULT_TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "synthetic_trace.jsonl"


@dataclass(frozen=True)
class TraceRequest:
    """One request of a Mooncake-format trace: arrival (ms), prompt and output lengths (tokens),
    and the hash ids of the prompt's 512-token blocks."""

    index: int
    arrival_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _check_request(r: TraceRequest) -> None:
    if r.input_length < 1:
        raise ValueError(f"request {r.index}: input_length {r.input_length} must be >= 1")
    if r.output_length < 1:
        raise ValueError(f"request {r.index}: output_length {r.output_length} must be >= 1")
    n = len(r.hash_ids)
    if not (n - 1) * HASH_BLOCK < r.input_length <= n * HASH_BLOCK:
        raise ValueError(f"request {r.index}: input_length {r.input_length} does not fit "
                         f"{n} hash blocks of {HASH_BLOCK} tokens (the last may be partial)")
    if r.hash_ids and (min(r.hash_ids) < 0 or max(r.hash_ids) >= PROMPT_ID_LIMIT // HASH_BLOCK - 1):
        raise ValueError(f"request {r.index}: hash ids must lie in [0, {PROMPT_ID_LIMIT // HASH_BLOCK - 1})")


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Reads a Mooncake-format JSONL trace (first `limit` requests when given), checking each
    line: ValueError names the line and the broken rule. Requests are kept in file order and
    must arrive in non-decreasing timestamp order."""
    out: list[TraceRequest] = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                o = json.loads(line)
                r = TraceRequest(len(out), float(o["timestamp"]), int(o["input_length"]),
                                 int(o["output_length"]), tuple(int(h) for h in o["hash_ids"]))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{line_no}: not a trace line ({e})") from e
            _check_request(r)
            if out and r.arrival_ms < out[-1].arrival_ms:
                raise ValueError(f"{path}:{line_no}: timestamp {r.arrival_ms} before the previous "
                                 f"{out[-1].arrival_ms}: requests must be in arrival order")
            out.append(r)
    return out


def write_trace(path: str | Path, trace: Sequence[TraceRequest]) -> None:
    """Writes a trace as Mooncake-format JSONL (integer ms timestamps)."""
    with open(path, "w") as f:
        for r in trace:
            f.write(json.dumps({"timestamp": int(r.arrival_ms), "input_length": r.input_length,
                                "output_length": r.output_length, "hash_ids": list(r.hash_ids)}) + "\n")


def generate_trace(n_requests: int, seed: int = 0, *, rate_per_s: float = 4.0,
                   n_system_prompts: int = 6, p_followup: float = 0.45, p_short: float = 0.2,
                   max_prompt: int = 32768) -> list[TraceRequest]:
    """A seeded synthetic trace in Mooncake's format: Poisson arrivals at `rate_per_s` requests
    per second; a new conversation starts with one of `n_system_prompts` shared system prompts
    (200 to 6,000 tokens) and a user message (30 to 4,000 tokens), or with probability `p_short`
    is a short prompt of 20 to 600 tokens that shares one of a few short headers; with
    probability `p_followup` a request is the next turn of an earlier conversation: its prompt is
    that conversation's last prompt (the same hash ids, its partial last block continued) plus
    the answer and a new message (30 to 3,000 tokens). Outputs are 1 to 400 tokens. Prompts are
    at most `max_prompt` tokens. ValueError for a bad count, rate or probability."""
    if n_requests < 1:
        raise ValueError(f"n_requests {n_requests} must be >= 1")
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s {rate_per_s} must be > 0")
    for name, p in (("p_followup", p_followup), ("p_short", p_short)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name} {p} must lie in [0, 1]")
    if max_prompt < 1024:
        raise ValueError(f"max_prompt {max_prompt} must be >= 1024")
    rng = np.random.default_rng(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    def extend(ids: list[int], length: int, extra: int) -> tuple[list[int], int]:
        # Continue the partial last block (same id, more of its tokens), then fresh blocks.
        new_len = length + extra
        need = -(-new_len // HASH_BLOCK)
        return ids + fresh(need - len(ids)), new_len

    systems = []
    for _ in range(n_system_prompts):
        n = int(rng.integers(200, 6000))
        systems.append((fresh(-(-n // HASH_BLOCK)), n))
    headers = []
    for _ in range(3):
        n = int(rng.integers(16, 200))
        headers.append((fresh(1), n))
    conversations: list[tuple[list[int], int]] = []
    out: list[TraceRequest] = []
    t = 0.0
    for i in range(n_requests):
        t += float(rng.exponential(1000.0 / rate_per_s))
        u = rng.random()
        if conversations and u < p_followup:
            c = int(rng.integers(len(conversations)))
            ids, length = conversations[c]
            ids, length = extend(ids, length, int(rng.integers(30, 3000)))
            if length > max_prompt:  # the conversation ends; start it afresh
                ids, length = extend(list(systems[c % len(systems)][0]), systems[c % len(systems)][1],
                                     int(rng.integers(30, 4000)))
            conversations[c] = (ids, length)
        elif u < p_followup + p_short * (1 - p_followup):
            hid, hlen = headers[int(rng.integers(len(headers)))]
            ids, length = extend(list(hid), hlen, int(rng.integers(4, 400)))
            conversations.append((ids, length))
        else:
            sid, slen = systems[int(rng.integers(len(systems)))]
            ids, length = extend(list(sid), slen, int(rng.integers(30, 4000)))
            conversations.append((ids, length))
        out.append(TraceRequest(i, round(t), length, int(rng.integers(1, 400)), tuple(ids)))
    for r in out:
        _check_request(r)
    return out


def prompt_tokens(r: TraceRequest) -> np.ndarray:
    """The request's prompt token ids (int32, input_length of them): position j of hash block h
    is 1 + 512 h + j, a bijection into [1, 2**30)."""
    h = np.asarray(r.hash_ids, dtype=np.int64)
    toks = (1 + h[:, None] * HASH_BLOCK + np.arange(HASH_BLOCK, dtype=np.int64)[None, :]).ravel()
    return toks[: r.input_length].astype(np.int32)


def decode_token(index: int, k: int) -> int:
    """The k-th sampled token id of request `index` (in [2**30, 2**31), never a prompt id)."""
    return DECODE_BASE + (index * 1000003 + k) % DECODE_BASE


def block_fingerprints(tokens: np.ndarray, block: int, upto_blocks: int,
                       start: list[int] | None = None) -> list[int]:
    """Chained fingerprints of the first `upto_blocks` full blocks of `tokens` (`block` tokens
    each): fp[i] = hash((fp[i-1], bytes of block i)); extends `start` (the first len(start)
    fingerprints, already computed) when given."""
    fps = start if start is not None else []
    prev = fps[-1] if fps else 0
    for i in range(len(fps), upto_blocks):
        prev = hash((prev, tokens[i * block:(i + 1) * block].tobytes()))
        fps.append(prev)
    return fps


def trace_ideal(trace: Sequence[TraceRequest], block: int) -> list[int]:
    """Per request, the prompt tokens an infinite cache of `block`-token blocks reuses: the
    longest prefix of full blocks held by an earlier request's prompt, at most
    input_length - 1 tokens (the last prompt token is always computed)."""
    seen: set[int] = set()
    out = []
    for r in trace:
        toks = prompt_tokens(r)
        fps = block_fingerprints(toks, block, r.input_length // block)
        cap = (r.input_length - 1) // block
        k = 0
        while k < cap and fps[k] in seen:
            k += 1
        out.append(k * block)
        seen.update(fps)
    return out
