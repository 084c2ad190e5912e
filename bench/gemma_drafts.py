"""Draft trees against chains on real text: Gemma 3 270M (the gemma extra) through KVCoreCache.

For each text (a prompt the model continues greedily for ``--new`` tokens) and each node
budget N of ``--budgets``: accepted tokens per forward of

- early-exit **trees** of N tokens (the root, a main line of drafts and a second guess
  beside each main-line draft; kvcore_demo.real_trees.decode_tree: verify_tree +
  commit_tree),
- early-exit **chains** of N tokens (the root and N - 1 greedy drafts of the same drafter;
  rejected drafts rewound),
- **prompt lookup** chains of N tokens (N - 1 drafts copied from what followed the latest
  earlier occurrence of the last 3, 2 or 1 tokens; no model),

each from its own copy of the prefilled cache, each run's tokens checked equal to plain
greedy decoding. The drafter is the model's first ``--draft-layers`` layers (default: all
but the last sixth, 15 of 18) with its final norm and LM head. Also, per text, the
teacher-forced agreement of an exit after k layers with the full model's greedy token
(top-1 and top-2, on the plain continuation): why the drafter is that deep.

Tokens per forward count the forwards of the target model only; tok/s is wall time with
the drafter's shallow forwards included (on this model the LM head, 262,144 x 640, is
most of any forward, so a shallow forward costs nearly a full one; one drafter serves
every run of a text, its prompt prefilled before the runs and rewound to it between
them). torch on one thread.

    python bench/gemma_drafts.py [--budgets 4,8] [--new 32] [--draft-layers 15] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import int_list, loadavg  # noqa: E402


def texts() -> dict[str, str]:
    """The prompts, by name: a story the model continues in its own words, a question answered
    from notes in the prompt, and a passage the text starts to copy out again."""
    from kvcore_demo import real, real_batch

    return {
        "story": real.DEFAULT_PROMPT,
        "question": real_batch.chat_texts(4)[3],  # "What happened on the night of the great storm?"
        "copy": real.PASSAGE + " The same history, copied out again by a visitor: The lighthouse on the northern cape",
    }


def exit_agreement(loaded: Any, prompt: list[int], plain: list[int], depths: Sequence[int]) -> dict[int, dict[str, float]]:
    """Per exit depth k: the share of `plain`'s tokens (the full model's greedy continuation of
    `prompt`) that the model cut after k layers (final norm and head applied to its hidden
    state) ranks first, and first or second, given the same preceding tokens."""
    import torch

    m = loaded.model
    seq = prompt + plain[:-1]
    n = len(prompt)
    target = torch.tensor(plain)
    out: dict[int, dict[str, float]] = {}
    with torch.no_grad():
        hidden = m(input_ids=torch.tensor([seq]), output_hidden_states=True, use_cache=False).hidden_states
        for k in depths:
            top2 = m.lm_head(m.model.norm(hidden[k][0, n - 1 :])).topk(2, -1).indices
            out[k] = {"top1": float((top2[:, 0] == target).float().mean()),
                      "top2": float((top2 == target[:, None]).any(-1).float().mean())}  # fmt: skip
    return out


def run_text(loaded: Any, name: str, text: str, budgets: Sequence[int], new: int, draft_layers: int) -> dict[str, Any]:
    """Plain greedy decoding of `text`, then trees, early-exit chains and prompt lookup at each budget."""
    from kvcore_demo import real, real_trees

    opts = real.RealDemoOptions(prompt=text, gen_len=new, max_step=64, draft=0, tree=max(budgets),
                                draft_layers=draft_layers)  # fmt: skip
    opts.check()
    prefilled = real.prefill_prompt(loaded, opts)
    starts = [prefilled.copy() for _ in range(3 * len(budgets))]
    plain = real.decode(loaded, opts, prefilled=prefilled)
    prompt_len = len(plain.prompt_ids)
    rows: list[dict[str, Any]] = []
    # One drafter for every early-exit run: it rewinds to the prompt between runs (deterministic,
    # so its drafts are the same as a fresh one's) instead of prefilling it again.
    drafter = real_trees.new_drafter(loaded, opts, prompt_len)
    drafter.draft(plain.prompt_ids, 1, 1)  # its prompt prefill, outside every run's time
    runs = {
        "tree (early exit)": lambda s, b: real_trees.decode_tree(loaded, opts, s, b, drafter=drafter),
        "chain (early exit)": lambda s, b: real_trees.decode_chain(loaded, opts, s, b, drafter=drafter),
        "chain (prompt lookup)": lambda s, b: real.decode_speculative(loaded, opts, s, draft=b - 1),
    }
    for budget in budgets:
        for kind, run in runs.items():
            t0, shallow = time.perf_counter(), drafter.forwards
            decoded, counts = run(starts.pop(), budget)
            seconds = time.perf_counter() - t0
            if "draft_forwards" in counts:
                counts["draft_forwards"] = drafter.forwards - shallow
            generated = len(decoded.tokens) - 1
            row = {
                "text": name, "budget": budget, "drafter": kind, "forwards": counts["forwards"],
                "tokens_per_forward": generated / max(counts["forwards"], 1),
                "tokens_per_s": generated / max(seconds, 1e-9),
                "tokens_equal_plain": decoded.tokens == plain.tokens,
                **{k: counts[k] for k in ("accepted", "drafted", "paths_off_main_line", "copies_layer0",
                                          "draft_forwards") if k in counts},
            }  # fmt: skip
            rows.append(row)
            print(f"{name:9s} N={budget:<2d} {kind:22s} {row['tokens_per_forward']:.2f} tokens/forward "
                  f"({row['forwards']:3d} forwards)  {row['tokens_per_s']:5.2f} tok/s  tokens "
                  f"{'equal' if row['tokens_equal_plain'] else 'DIFFER'}", flush=True)  # fmt: skip
    layers = int(loaded.model.config.num_hidden_layers)
    agreement = exit_agreement(loaded, plain.prompt_ids, plain.tokens, sorted({4, 9, 12, 15, draft_layers, layers - 1}))
    print(f"{name:9s} exit agreement with the full model (top-1 / top-2): " + ", ".join(
        f"k={k} {a['top1']:.2f}/{a['top2']:.2f}" for k, a in agreement.items()), flush=True)  # fmt: skip
    return {
        "text": name, "prompt_len": prompt_len, "generated": len(plain.tokens),
        "plain_tokens_per_s": (len(plain.tokens) - 1) / max(plain.decode_seconds, 1e-9),
        "continuation": loaded.tokenizer.decode(plain.tokens, skip_special_tokens=True),
        "exit_agreement": {str(k): v for k, v in agreement.items()}, "rows": rows,
    }  # fmt: skip


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--budgets", type=int_list, default=[4, 8], help="tokens per forward, root included (comma-separated)")
    p.add_argument("--new", type=int, default=32, help="tokens to generate per text")
    p.add_argument("--draft-layers", type=int, default=0, help="early-exit depth (0: all but the last sixth)")
    p.add_argument("--texts", default=None, help="comma-separated subset of: story, question, copy")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    import torch

    from kvcore_demo import real
    from kvcore.integrations import transformers_models as real_model

    torch.set_num_threads(1)
    loaded = real_model.load("gemma-3-270m")
    chosen = texts() if args.texts is None else {k: texts()[k] for k in args.texts.split(",")}
    draft_layers = dataclasses.replace(real.RealDemoOptions(), tree=2, draft_layers=args.draft_layers).tree_draft_layers
    results = [run_text(loaded, name, text, args.budgets, args.new, draft_layers) for name, text in chosen.items()]
    ok = all(r["tokens_equal_plain"] for t in results for r in t["rows"])
    if args.out:
        meta = {"machine": platform.machine(), "loadavg": loadavg(), "torch": torch.__version__, "new": args.new,
                "budgets": args.budgets, "draft_layers": draft_layers, "model": "gemma-3-270m", "max_step": 64}  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "texts": results, "all_tokens_equal_plain": ok}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
