"""``kvcore demo --model NAME``: the run and its report. Prefills and decodes through
kvcore_demo.real, checks the logits against a full recomputation, and with ``draft`` /
``tree`` decodes again with prompt-lookup drafts or early-exit draft trees and chains
(kvcore_demo.real_trees), each checked to give plain decoding's tokens. The command
exits 0 when every check holds, 1 when not, 2 on bad options or a missing package.
"""

from __future__ import annotations

from typing import Any

from kvcore_demo import real_trees
from kvcore.integrations import transformers_models as real_model
from kvcore_demo.options import kv_bytes_all_flat
from kvcore_demo.real import (
    Prefilled,
    RealDemoOptions,
    check_against_recomputation,
    decode,
    decode_speculative,
    prefill_prompt,
    torch_threads,
)
from kvcore_demo.runner import Progress, check_entry, format_checks


def run_real_demo(
    opts: RealDemoOptions, progress: Progress | None = None, loaded: real_model.LoadedModel | None = None
) -> dict[str, Any]:
    """Runs the demo on `loaded` (default: ``real_model.load(opts.model)``); returns
    the report (``report["ok"]`` tells whether every check passed). Raises ValueError
    for bad options, MissingModelPackageError when a package is missing."""
    opts.check()
    bar = progress or Progress(None)
    if loaded is None:
        bar.update("loading", 0, 1)
        loaded = real_model.load(opts.model)
    with torch_threads(1):
        prefilled = prefill_prompt(loaded, opts, bar)
        spec_start = prefilled.copy() if opts.draft else None
        tree_starts = (prefilled.copy(), prefilled.copy()) if opts.tree else None
        decoded = decode(loaded, opts, bar, prefilled)
        bar.update("recompute", 0, 1)
        checks = [check_against_recomputation(loaded.model, decoded)]
        spec: dict[str, Any] | None = None
        if spec_start is not None:
            run, spec = decode_speculative(loaded, opts, spec_start, bar)
            spec["tokens_per_s"] = (len(run.tokens) - 1) / max(run.decode_seconds, 1e-9)
            spec_check = check_against_recomputation(loaded.model, run)
            same = run.tokens == decoded.tokens
            checks.append(check_entry(
                "speculative decoding (prompt-lookup drafts, rewinds) equals plain decoding",
                same and bool(spec_check["ok"]),
                f"tokens {'equal' if same else 'DIFFER'}; {spec_check['detail']}",
            ))
        tree: dict[str, Any] | None = None
        if tree_starts is not None:
            tree, tree_check = _trees_against_chains(loaded, opts, tree_starts, decoded.tokens, bar)
            checks.append(tree_check)
    bar.close()
    cfg = loaded.model.config
    layer_types = list(cfg.layer_types)
    cache = decoded.cache
    length = cache.get_seq_length()
    kv_all_flat = kv_bytes_all_flat(cfg.num_hidden_layers, length, cfg.num_key_value_heads, cfg.head_dim, 4)
    # At the model's whole context a sliding layer still holds its ring; a full layer every position.
    context = int(cfg.max_position_embeddings)
    row_bytes = kv_bytes_all_flat(1, 1, cfg.num_key_value_heads, cfg.head_dim, 4)
    at_context = sum(cache.rows(i) if kind == "sliding_attention" else context for i, kind in enumerate(layer_types))
    return {
        "ok": all(bool(c["ok"]) for c in checks),
        "checks": checks,
        "model": {
            "name": loaded.name,
            "layers": cfg.num_hidden_layers,
            "sliding_layers": layer_types.count("sliding_attention"),
            "full_layers": layer_types.count("full_attention"),
            "window": cfg.sliding_window,
            "n_kv_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "vocab_size": cfg.vocab_size,
            "directory": str(loaded.directory),
            "converted_now": loaded.converted,
            "load_seconds": loaded.seconds,
        },
        "dtype": "float32",
        "max_step": cache.max_step,
        "prompt_len": len(decoded.prompt_ids),
        "generated": len(decoded.tokens),
        "tokens": decoded.tokens,
        "text": loaded.tokenizer.decode(decoded.tokens, skip_special_tokens=True),
        "prompt_tail": loaded.tokenizer.decode(decoded.prompt_ids[-24:], skip_special_tokens=True),
        "prefill_tokens_per_s": len(decoded.prompt_ids) / max(decoded.prefill_seconds, 1e-9),
        "decode_tokens_per_s": max(len(decoded.tokens) - 1, 0) / max(decoded.decode_seconds, 1e-9),
        "draft": opts.draft,
        "speculative": spec,
        "tree": tree,
        "kv_bytes": cache.nbytes(),
        "kv_bytes_all_flat": kv_all_flat,
        "length": length,
        "context": context,
        "kv_bytes_at_context": at_context * row_bytes,
        "kv_bytes_all_flat_at_context": kv_bytes_all_flat(cfg.num_hidden_layers, context, cfg.num_key_value_heads,
                                                          cfg.head_dim, 4),
    }


def _trees_against_chains(
    loaded: real_model.LoadedModel,
    opts: RealDemoOptions,
    starts: tuple[Prefilled, Prefilled],
    plain: list[int],
    bar: Progress,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tree run (``opts.tree`` tokens per forward) and the chain run of the same budget and
    drafter, each from its own copy of the prefilled cache; their counts and the check that
    both give `plain`'s tokens and the tree run's kept logits pass the recomputation."""
    run, counts = real_trees.decode_tree(loaded, opts, starts[0], opts.tree, bar)
    chain_run, chain = real_trees.decode_chain(loaded, opts, starts[1], opts.tree, bar)
    counts["chain"] = chain
    recomputed = check_against_recomputation(loaded.model, run)
    same, chain_same = run.tokens == plain, chain_run.tokens == plain
    check = check_entry(
        "draft trees (early exit, commit_tree) equal plain decoding",
        same and chain_same and bool(recomputed["ok"]),
        f"tokens {'equal' if same else 'DIFFER'} (chains of the same budget: "
        f"{'equal' if chain_same else 'DIFFER'}); {recomputed['detail']}",
    )
    return counts, check


def format_report(r: dict[str, Any]) -> str:
    """The report as text: the model, the generated text, speeds, K/V bytes, the checks."""
    m = r["model"]
    mib = 1024.0 * 1024.0
    loaded = "converted and cached" if m["converted_now"] else "loaded from"
    lines = [
        f"kvcore demo --model {m['name']}: {m['layers']} layers ({m['sliding_layers']} sliding W={m['window']} : "
        f"{m['full_layers']} full), {m['n_kv_heads']} KV head x {m['head_dim']}, vocabulary {m['vocab_size']:,}, "
        f"{r['dtype']} K/V, max_step {r['max_step']}",
        f"  weights   {loaded} {m['directory']} in {m['load_seconds']:.1f} s",
        f"  prompt    {r['prompt_len']} tokens, ending {'...' + r['prompt_tail']!r}",
        f"  output    {r['text']!r}",
        f"  prefill   {r['prompt_len']} tokens at {r['prefill_tokens_per_s']:.0f} tok/s",
        f"  decode    {r['generated']} tokens at {r['decode_tokens_per_s']:.1f} tok/s",
        f"  KV held   {r['kv_bytes'] / mib:.1f} MiB vs {r['kv_bytes_all_flat'] / mib:.1f} MiB all-flat at "
        f"{r['length']} positions ({r['kv_bytes_all_flat'] / max(r['kv_bytes'], 1):.1f}x less); at the whole "
        f"{r['context']:,}-token context {r['kv_bytes_at_context'] / mib:.0f} MiB vs "
        f"{r['kv_bytes_all_flat_at_context'] / mib:.0f} MiB ({r['kv_bytes_all_flat_at_context'] / r['kv_bytes_at_context']:.1f}x)",
    ]
    s = r["speculative"]
    if s is not None:
        lines.append(
            f"  drafts    prompt lookup, up to {r['draft']} per forward: {s['accepted']}/{s['drafted']} accepted, "
            f"{(r['generated'] - 1) / max(s['forwards'], 1):.2f} tokens per forward ({s['forwards']} forwards for "
            f"{r['generated'] - 1} tokens), {s['rewinds']} rewinds, {s['tokens_per_s']:.1f} tok/s"
        )
    t = r.get("tree")
    if t is not None:
        c = t["chain"]
        lines.append(
            f"  trees     early exit after {t['draft_layers']} of {m['layers']} layers, up to {t['budget']} tokens per "
            f"forward: {t['tokens_per_forward']:.2f} tokens per forward ({t['forwards']} forwards, "
            f"{t['paths_off_main_line']} accepted paths off the main line, {t['copies_layer0']} row copies per layer), "
            f"{t['tokens_per_s']:.1f} tok/s; chains of {t['budget'] - 1} drafts: {c['tokens_per_forward']:.2f} tokens "
            f"per forward ({c['forwards']} forwards), {c['tokens_per_s']:.1f} tok/s"
        )
    return "\n".join(lines + format_checks(r))




__all__ = ["format_report", "run_real_demo"]
