"""``kvcore demo --disaggregated --model NAME``: a real model's prefill and decode on different Ray actors.

A prefill actor loads the model, prefills each chat (kvcore_demo.real_batch's
system prompt and one visitor's question) through a ``KVCoreCache`` in chunks of
``max_step`` tokens, and exports the sequence as a record (kvcore.state: the K/V
rows of kvcore's torch pool, every layer, sliding rings included); Ray's object
store hands the record to a decode actor, which imports it into a new
``KVCoreCache`` and decodes greedily. The driver decodes every chat in one
process and checks that the tokens are equal and the logits agree within
kvcore_demo.real.TOLERANCE. Each actor holds its own copy of the model (about
1.1 GB of float32 weights). Needs the gemma and distributed extras.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from kvcore._errors import InvalidArgumentError
from kvcore_demo import real, real_batch
from kvcore.integrations import transformers_models as real_model
from kvcore_demo.runner import check_entry, format_checks


@dataclasses.dataclass(frozen=True)
class RealDisaggregatedOptions:
    """Knobs of ``kvcore demo --disaggregated --model NAME``: the model, how many chats,
    tokens each generates at most, the largest forward (tokens) and a Ray cluster's
    address (None: start a local instance of two CPUs)."""

    model: str = "gemma-3-270m"
    chats: int = 2
    gen_len: int = 16
    max_step: int = 64
    address: Optional[str] = None

    def check(self) -> None:
        """Raises ValueError naming the first bad option."""
        real_batch.RealBatchOptions(model=self.model, chats=self.chats, gen_len=self.gen_len).check()
        self.demo_options("the prompt").check()

    def demo_options(self, prompt: str) -> real.RealDemoOptions:
        """The single-sequence options of one chat with text `prompt` (no drafts)."""
        return real.RealDemoOptions(model=self.model, prompt=prompt, gen_len=self.gen_len,
                                    max_step=self.max_step, draft=0)  # fmt: skip


class Prefill:
    """A Ray actor: the model, prefilling chats and exporting them as records."""

    def __init__(self, opts: RealDisaggregatedOptions) -> None:
        self.opts, self.loaded = opts, real_model.load(opts.model)

    def prefill(self, text: str) -> tuple[bytes, list[int], Any]:
        """The record of chat `text` prefilled, its prompt ids and its last position's logits (numpy)."""
        from kvcore.state import export_sequence

        with real.torch_threads(1):
            p = real.prefill_prompt(self.loaded, self.opts.demo_options(text))
        last = p.logits[len(p.prompt_ids) - 1].numpy()
        return bytes(export_sequence(p.cache.pool)), p.prompt_ids, last


class Decode:
    """A Ray actor: the model, importing records and decoding them."""

    def __init__(self, opts: RealDisaggregatedOptions) -> None:
        self.opts, self.loaded = opts, real_model.load(opts.model)

    def decode(self, prefilled: tuple[bytes, list[int], Any]) -> tuple[list[int], Any]:
        """Imports a record from Prefill.prefill and decodes greedily: its tokens and the logits
        of every decode position (numpy, one row per generated token)."""
        import torch

        from kvcore.state import import_sequence

        record, prompt_ids, last = prefilled
        opts = self.opts.demo_options("")
        cache = real.new_cache(self.loaded, opts, len(prompt_ids))
        import_sequence(cache.pool, record)
        if cache.pool.cache.length != len(prompt_ids):  # the ids travel beside the record: they must agree
            raise InvalidArgumentError(
                f"the record holds {cache.pool.cache.length} positions, its prompt {len(prompt_ids)} token ids"
            )
        start = real.Prefilled(prompt_ids, cache, {len(prompt_ids) - 1: torch.from_numpy(last)}, 0.0)
        with real.torch_threads(1):
            run = real.decode(self.loaded, opts, prefilled=start)
        return run.tokens, torch.stack([run.logits[p] for p in sorted(run.logits)]).numpy()


def run_real_disaggregated(opts: RealDisaggregatedOptions) -> dict[str, Any]:
    """Runs the chats on a prefill actor and a decode actor, then each in this process; the
    report (``report["ok"]``: tokens equal and logits within tolerance for every chat)."""
    import numpy as np
    import ray

    opts.check()
    texts = real_batch.chat_texts(opts.chats)
    started = not ray.is_initialized()
    if started:
        ray.init(address=opts.address, num_cpus=None if opts.address else 2, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)  # fmt: skip
    try:
        # Actors take no CPU slot: both share a local instance of two CPUs.
        prefill_actor: Any = ray.remote(num_cpus=0)(Prefill).remote(opts)
        decode_actor: Any = ray.remote(num_cpus=0)(Decode).remote(opts)
        refs = [decode_actor.decode.remote(prefill_actor.prefill.remote(t)) for t in texts]
        remote = ray.get(refs)
    finally:
        if started:
            ray.shutdown()
    loaded = real_model.load(opts.model)
    problems, worst = [], 0.0
    answers = []
    with real.torch_threads(1):
        for i, text in enumerate(texts):
            alone = real.decode(loaded, opts.demo_options(text))
            want = np.stack([alone.logits[p].numpy() for p in sorted(alone.logits)])
            tokens, logits = remote[i]
            answers.append(loaded.tokenizer.decode(tokens, skip_special_tokens=True))
            if tokens != alone.tokens:
                problems.append(f"chat {i}: tokens differ")
                continue
            worst = max(worst, float(np.abs(logits - want[-len(logits) :]).max()))
    ok = not problems and worst <= real.TOLERANCE
    detail = "; ".join(problems) or f"tokens equal, max |logit diff| {worst:.2e} (tolerance {real.TOLERANCE:.0e})"
    checks = [check_entry("every chat decoded from its record equals single-process decoding", ok, detail)]
    return {"ok": ok, "checks": checks, "model": opts.model, "chats": opts.chats,
            "answers": [{"question": q, "answer": a} for q, a in zip(real_batch.QUESTIONS, answers)]}  # fmt: skip


def format_report(r: dict[str, Any]) -> str:
    """The report as text: each chat's answer (its first line), then the checks."""
    lines = [f"kvcore demo --disaggregated --model {r['model']}: {r['chats']} chats prefilled on one Ray actor, "
             "moved as records, decoded on another"]  # fmt: skip
    for a in r["answers"]:
        first = a["answer"].strip().splitlines()[0] if a["answer"].strip() else ""
        lines.append(f"  Q: {a['question']}\n     A: {first}")
    return "\n".join(lines + format_checks(r))


__all__ = ["Decode", "Prefill", "RealDisaggregatedOptions", "format_report", "run_real_disaggregated"]
