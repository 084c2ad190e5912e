"""`kvcore demo --batch`: many concurrent chats through one BatchCache, each proved exact.

The reference model (kvcore_demo.model) serves a queue of chats the way a serving
engine does, one ``begin_step`` over every active sequence per step and one
batched forward (``Model.forward_batch``) through ``BatchCache`` +
``PagedKVPool``:

- every chat starts with the same system prompt; a chat that joins adopts the
  longest cached prefix of its prompt (``adopt_prefix``) and prefills only the
  rest, in chunks of at most ``max_step``; every step passes its token ids, so
  full blocks are named and can be adopted;
- chats arrive at different steps and wait in a queue while the sequences in
  flight are at the concurrency limit; a finished chat releases its sequence,
  and the id is reused by the next chat (continuous batching);
- some chats fork after their prompt into parallel samples (``fork``, sharing
  every block; the shared partial block is copied on write); sample j starts
  from the j-th most likely first token, so the samples diverge;
- some chats decode speculatively: each step carries the last token plus k
  drafts, the accepted prefix is kept and the rejected drafts are rewound
  (``rewind``). The drafts are a perfect draft model's (the oracle's greedy
  continuation) with one token corrupted at a random place or none, as in
  ``kvcore demo``, so steps accept anything from 0 to k drafts;
- with ``--tree N`` every chat decodes with draft trees instead (docs/trees.md):
  each step of a chat is a tree of up to N tokens from a real cheap drafter,
  the model's own first layers (kvcore_demo.early_exit, one drafter cache per
  sequence; kvcore_demo.trees shapes the tree), all chats' trees verified in
  the one batched forward; each chat's accepted root path is committed
  (``commit(step, accepted={seq: path})``) and the returned row copies applied
  (``PagedKVPool.apply_copies``).

The check, every step: the logits of every new token (rejected drafts and tree
nodes included; a node's sequence is its root path) must equal that chat's own
full recomputation, ``Model.forward_full`` of the chat's token sequence so far
(explicit visibility masks, no cache). Running
``forward_full`` over the whole history for every chat at every step would
redo the history each step, so the oracle is computed incrementally:
``Oracle.logits(tokens)`` is ``forward_full(tokens)`` with the K/V of the longest
prefix it has already computed kept (every position of every layer, no window,
no paging, nothing from kvcore), recomputing only from the first token that
differs (after a rewind). When a chat finishes, every logit row it kept is also
compared with one literal ``forward_full`` of its whole sequence, and every
token it generated must be that recomputation's greedy token (plain greedy
decoding; a forked sample's first token is its j-th choice by design).

Exits 0 when every check passes, 1 when one fails, 2 on bad options.
"""

from __future__ import annotations

from typing import Any

from kvcore_demo.batch_chats import BatchDemoOptions, Branch, Chat, Oracle, make_chats
from kvcore_demo.batch_server import BatchServer
from kvcore_demo.runner import Progress

__all__ = ["BatchDemoOptions", "BatchServer", "Branch", "Chat", "Oracle", "format_report", "make_chats", "run_batch_demo"]


def run_batch_demo(opts: BatchDemoOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Runs the demo; returns the report (``report["ok"]`` tells whether all checks passed)."""
    opts.check()
    server = BatchServer(opts, progress or Progress(None))
    try:
        server.run()
    finally:
        server.bar.close()
    return server.report()


def format_report(r: dict[str, Any]) -> str:
    m, ch, px, fk, sp, kv, orc = r["model"], r["chats"], r["prefix"], r["forks"], r["speculative"], r["kv"], r["oracle"]
    kib = 1024.0

    def ratio(a: int, b: int) -> str:
        return f"{a / max(b, 1):.1f}x"

    lines = [
        f"kvcore demo --batch: {ch['total']} chats on a {m['layers']}-layer Gemma-style model "
        f"({m['ring_layers']} ring W={m['window']} S={m['sinks']} : {m['flat_layers']} flat), {r['dtype']} K/V, "
        f"blocks of {r['block_size']}, max_step {r['max_step']}",
        f"  served    {ch['sequences']} sequences in {r['steps']} steps, up to {ch['peak_sequences']} at once "
        f"(limit {ch['concurrency']}): {r['tokens']['total']} tokens at {r['tokens_per_s']:.0f} tok/s, "
        f"{r['tokens']['generated']} generated at {r['generated_tokens_per_s']:.0f} tok/s",
        f"  batching  {ch['joined_mid_run']} chats joined mid-run ({ch['waited']} waited for a free sequence), "
        f"{ch['left_mid_run']} left mid-run, sequence ids reused {ch['ids_reused']} times",
        f"  prefix    {px['hits']}/{px['lookups']} chats adopted a cached prefix of the {px['shared_len']}-token "
        f"system prompt ({px['full_hits']} all of its full blocks): {px['tokens_reused']} tokens not recomputed",
        f"  forks     {fk['forks']} chats forked into {fk['samples']} samples, "
        f"{fk['copy_on_write_blocks']} blocks copied on write",
    ]
    tr = r["trees"]
    if not tr["size"]:  # with --tree the trees line below reports the speculation
        lines.append(
            f"  drafts    {sp['steps']} speculative steps, {sp['accepted']}/{sp['drafted']} drafts accepted, "
            f"{sp['rewinds']} rewinds of {sp['rewound_tokens']} tokens")
    else:
        off = tr["paths_off_main_line"]
        lines.append(
            f"  trees     {tr['steps']} tree steps of up to {tr['size']} nodes ({tr['nodes']} in all) drafted by the "
            f"first {tr['draft_layers']} layers ({tr['draft_forwards']} shallow forwards): "
            f"{tr['tokens_per_forward']:.2f} accepted tokens per forward, {off} path{'' if off == 1 else 's'} off the main line, "
            f"{tr['copies']} row copies")
    lines += [
        f"  KV held   {kv['peak_bytes'] / kib:.1f} KiB at the peak (step {kv['peak_step']}, {kv['peak_sequences']} "
        f"sequences) vs {kv['peak_no_sharing_bytes'] / kib:.1f} KiB without shared blocks "
        f"({ratio(kv['peak_no_sharing_bytes'], kv['peak_bytes'])} more) and {kv['peak_all_flat_bytes'] / kib:.1f} KiB "
        f"all-flat ({ratio(kv['peak_all_flat_bytes'], kv['peak_bytes'])} more)",
        f"            ring groups: up to {kv['ring_blocks_released_peak']} blocks released behind the window; "
        f"{kv['reserved_bytes'] / kib:.1f} KiB of storage reserved",
        f"  oracle    max |logit diff| {orc['max_abs_logit_diff']:.2e} every step, {orc['final_max_abs_logit_diff']:.2e} "
        f"at the end (tolerance {orc['tolerance']:.0e})",
        f"            incremental forward_full computed {orc['positions_computed']} positions "
        f"(forward_full per chat per step: {orc['positions_per_step_forward_full']})",
    ]
    for c in r["checks"]:
        lines.append(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}")
    if r["first_failure"] is not None:
        f = r["first_failure"]
        lines.append(f"  first failure: {f['check']} check at step {f['step']}, chat {f['chat']} sample {f['sample']}, "
                     f"position {f['position']}: |diff| {f['diff']:.2e}")
    lines.append("result: " + ("all checks passed" if r["ok"] else "CHECKS FAILED"))
    return "\n".join(lines)
