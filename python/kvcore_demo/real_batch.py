"""``kvcore demo --batch --model NAME``: real chats sharing a real system prompt, served by kvcore.

Every chat is the system prompt (kvcore_demo.real.PASSAGE, a museum's history of a
lighthouse, longer than the 512-token window, introduced as the guide's notes)
followed by one visitor's question. All chats go through kvcore's continuous
batching (``kvcore.integrations.transformers_batch.generate_batch``: ``BatchCache`` plans every
forward, later chats adopt the system prompt's blocks from the cache instead of
recomputing them, K/V in kvcore's torch paged pool), greedily. The check: every
chat's tokens equal transformers' own ``generate()`` of that chat alone (its
``DynamicCache``, nothing shared). Exits 0 when they do, 1 when not, 2 on bad
options or a missing package.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from kvcore_demo import real
from kvcore.integrations import transformers_models as real_model
from kvcore_demo.runner import Progress, check_entry, format_checks

#: The system prompt every chat starts with.
SYSTEM_PROMPT = (
    "The guide of the lighthouse museum on the northern cape answers visitors' questions from these notes.\n\n"
    + real.PASSAGE
)
#: The visitors' questions, one per chat (the first --chats of them).
QUESTIONS = (
    "Who was the first keeper of the lighthouse?",
    "What did Elena record in her book?",
    "How did the fishermen set their watches?",
    "What happened on the night of the great storm?",
    "What can visitors see in the museum today?",
    "Why was the lighthouse built?",
    "Who is the guide of the museum?",
    "What did the astronomer teach the keepers?",
)


@dataclasses.dataclass(frozen=True)
class RealBatchOptions:
    """Knobs of ``kvcore demo --batch --model NAME``: the model, how many chats (each
    one of QUESTIONS), tokens each generates at most, rows per cache block and new
    tokens of one forward over all chats."""

    model: str = "gemma-3-270m"
    chats: int = 4
    gen_len: int = 24
    block_size: int = 32
    max_batch_tokens: int = 128

    def check(self) -> None:
        """Raises ValueError naming the first bad option: an unknown model, a chat count
        outside [1, len(QUESTIONS)], or a count below 1."""
        real_model.check_name(self.model)
        if not 1 <= self.chats <= len(QUESTIONS):
            raise ValueError(f"--chats = {self.chats}: must be in [1, {len(QUESTIONS)}] (one question per chat)")
        for name in ("gen_len", "block_size", "max_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)}: must be >= 1")


def chat_texts(chats: int) -> list[str]:
    """The text of the first `chats` chats: the system prompt, then a visitor's question."""
    return [f"{SYSTEM_PROMPT}\n\nVisitor: {q}\nGuide:" for q in QUESTIONS[:chats]]


def chat_prompts(tokenizer: Any, chats: int) -> list[list[int]]:
    """The token ids of the first `chats` chats (chat_texts)."""
    return [tokenizer(text).input_ids for text in chat_texts(chats)]


def run_real_batch_demo(
    opts: RealBatchOptions, progress: Progress | None = None, loaded: real_model.LoadedModel | None = None
) -> dict[str, Any]:
    """Runs the chats through kvcore's generate_batch and each alone through transformers'
    generate(); the report (``report["ok"]``: every chat's tokens equal)."""
    import torch
    from transformers import GenerationConfig

    from kvcore.integrations.transformers_batch import BatchCounters, generate_batch

    opts.check()
    bar = progress or Progress(None)
    if loaded is None:
        bar.update("loading", 0, 1)
        loaded = real_model.load(opts.model)
    model, tokenizer = loaded.model, loaded.tokenizer
    prompts = chat_prompts(tokenizer, opts.chats)
    eos = tokenizer.eos_token_id
    gen = GenerationConfig(max_new_tokens=opts.gen_len, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    counters = BatchCounters()
    with real.torch_threads(1), torch.no_grad():
        bar.update("kvcore", 0, opts.chats + 1)
        start = time.perf_counter()
        ours = generate_batch(model, prompts, gen, counters=counters, block_size=opts.block_size,
                              max_batch_tokens=opts.max_batch_tokens, max_seqs=opts.chats,
                              capacity=max(map(len, prompts)) + opts.gen_len)  # fmt: skip
        kvcore_seconds = time.perf_counter() - start
        theirs = []
        start = time.perf_counter()
        for i, p in enumerate(prompts):
            bar.update("transformers", i + 1, opts.chats + 1)
            out = model.generate(torch.tensor([p]), generation_config=gen)
            theirs.append(out[0, len(p) :].tolist())
        their_seconds = time.perf_counter() - start
    bar.close()
    mine = [list(r.generated_tokens) for r in ours.values()]
    # generate() pads nothing for one prompt but stops at eos inclusive, as generate_batch does.
    same = sum(a == b for a, b in zip(mine, theirs))
    checks = [check_entry("every chat's tokens equal transformers' generate() of it alone",
                          same == opts.chats == len(mine), f"{same}/{opts.chats} chats identical")]  # fmt: skip
    generated = sum(map(len, mine))
    return {
        "ok": all(bool(c["ok"]) for c in checks),
        "checks": checks,
        "model": loaded.name,
        "chats": opts.chats,
        "system_prompt_tokens": len(tokenizer(SYSTEM_PROMPT).input_ids),
        "prompt_tokens": sum(map(len, prompts)),
        "generated_tokens": generated,
        "answers": [{"question": q, "answer": tokenizer.decode(t, skip_special_tokens=True)}
                    for q, t in zip(QUESTIONS, mine)],  # fmt: skip
        "kvcore_seconds": kvcore_seconds,
        "transformers_seconds": their_seconds,
        "kvcore_tokens_per_s": (counters.tokens_computed) / max(kvcore_seconds, 1e-9),
        "kvcore": counters.as_dict(),
    }


def format_report(r: dict[str, Any]) -> str:
    """The report as text: each chat's answer (its first line), prompt tokens computed and
    adopted, peak K/V, seconds, the checks."""
    c = r["kvcore"]
    mib = 1024.0 * 1024.0
    lines = [f"kvcore demo --batch --model {r['model']}: {r['chats']} chats sharing a "
             f"{r['system_prompt_tokens']}-token system prompt, greedy"]  # fmt: skip
    for a in r["answers"]:
        first = a["answer"].strip().splitlines()[0] if a["answer"].strip() else ""
        lines.append(f"  Q: {a['question']}\n     A: {first}")
    lines += [
        f"  prompt    {r['prompt_tokens']} tokens, {c['prompt_tokens_computed']} computed ({c['prefix_hit_tokens']} "
        f"adopted from the cache by {c['prefix_hits']} chats)",
        f"  served    {c['tokens_computed']} tokens in {c['forwards']} forwards, {r['kvcore_seconds']:.1f} s "
        f"({r['kvcore_tokens_per_s']:.0f} tok/s); transformers' generate() one chat at a time "
        f"{r['transformers_seconds']:.1f} s",
        f"  KV peak   {c['peak_kv_bytes'] / mib:.1f} MiB in {c['peak_blocks']} blocks",
    ]
    return "\n".join(lines + format_checks(r))


__all__ = ["QUESTIONS", "SYSTEM_PROMPT", "RealBatchOptions", "chat_prompts", "chat_texts", "format_report", "run_real_batch_demo"]
