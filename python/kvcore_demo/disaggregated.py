"""``kvcore demo --disaggregated``: prefill on some Ray actors, decode on another.

Two prefill actors compute the chats' prompts (a shared system prompt, then each
chat's own tokens) with the demo model through a ``SequenceCache`` and export
each sequence as a record (kvcore.state) straight into a numpy buffer, which
Ray's object store hands to the decode actor without a copy in Python. The
decode actor holds the system prompt already (its blocks named by their token
ids), imports every record into its ``BatchCache`` (sharing the system prompt's
blocks instead of writing them) and decodes all chats together, one token per
chat per step. The driver then decodes every chat alone in one process and
checks that the tokens are equal and the logits agree within the dtype's
tolerance.

``ray.init()`` starts a local instance (``address`` joins a cluster instead:
the same code runs there). Needs the ``distributed`` extra (``pip install
"kvcore[distributed]"``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import numpy.typing as npt

import kvcore
from kvcore_demo.model import Decoder, Model
from kvcore_demo.options import TOLERANCE, ModelOptions, kv_dtype
from kvcore.state import import_sequence

Array = npt.NDArray[Any]


@dataclasses.dataclass(frozen=True)
class DisaggregatedOptions(ModelOptions):
    """The demo's sizes (chats, prompt lengths in tokens, tokens to generate, rows per
    block, prefill actors) and, from ModelOptions, its model and K/V dtype: here
    ModelConfig's own small shape (6 layers, window 16, no sinks, d_model 64)."""

    chats: int = 4
    system_len: int = 32
    prompt_len: int = 20
    gen_len: int = 12
    block_size: int = 16
    prefill_actors: int = 2
    #: A Ray cluster's address; None starts a local instance.
    address: Optional[str] = None
    layers: int = 6
    window: int = 16
    sinks: int = 0
    d_model: int = 64
    head_dim: int = 16
    d_ff: int = 128
    vocab_size: int = 256

    def model(self) -> Model:
        """The demo model (every actor builds the same one from the seed)."""
        return Model(self.model_config())

    @property
    def capacity(self) -> int:
        """Longest sequence (positions): the system prompt, a chat's own prompt and its tokens."""
        return self.system_len + self.prompt_len + self.gen_len + 1

    def check(self) -> None:
        """Raises ValueError naming the first option the run cannot honour, before any
        Ray process starts: a value below its least, --max-step above the longest
        sequence, a dtype the model cannot compute in (or bfloat16 without ml_dtypes);
        kvcore.InvalidArgumentError when kvcore refuses the decode actor's cache."""
        at_least = {"chats": 1, "system_len": 0, "prompt_len": 1, "gen_len": 1, "layers": 1, "window": 1,
                    "block_size": 1, "max_step": 1, "prefill_actors": 1}
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)}: must be >= {low}")
        self.check_step(self.capacity, 0, "--system-len + --prompt-len + --gen-len + 1")
        self.check_dtype()
        kv_dtype(self.dtype)
        self.model_config().cache_config(self.capacity, self.max_step, batch=self.limits())

    def limits(self) -> kvcore.BatchLimits:
        """The decode actor's BatchLimits: blocks of block_size rows, every chat and the system prompt."""
        return kvcore.BatchLimits(block_size=self.block_size, max_seqs=self.chats + 1)


def make_prompts(opts: DisaggregatedOptions) -> tuple[list[int], list[list[int]]]:
    """The system prompt and each chat's whole prompt (system prompt first)."""
    rng = np.random.default_rng(opts.seed + 1)
    vocab = opts.model().config.vocab_size
    system = [int(t) for t in rng.integers(0, vocab, opts.system_len)]
    return system, [system + [int(t) for t in rng.integers(0, vocab, opts.prompt_len)] for _ in range(opts.chats)]


class Prefill:
    """A prefill worker: computes a prompt and exports the sequence as a record."""

    def __init__(self, opts: DisaggregatedOptions) -> None:
        self.opts = opts
        self.model = opts.model()

    def prefill(self, prompt: list[int]) -> tuple[Array, Array]:
        """The record (numpy uint8, written in place by export_into) and the prompt's last logits."""
        dec = Decoder(self.model, self.opts.capacity, self.opts.max_step, kv_dtype(self.opts.dtype))
        logits = dec.feed(prompt)
        record = np.empty(dec.pool.export_size(len(prompt)), dtype=np.uint8)
        dec.pool.export_into(record, prompt)
        return record, logits[-1]


class Decode:
    """The decode worker: a BatchCache that holds the system prompt and decodes imported chats together."""

    def __init__(self, opts: DisaggregatedOptions, system: list[int]) -> None:
        self.opts = opts
        self.model = opts.model()
        cfg = self.model.config.cache_config(opts.capacity, opts.max_step, batch=opts.limits())
        self.cache = kvcore.BatchCache(cfg)
        self.pool = kvcore.PagedKVPool(self.cache, kv_dtype(opts.dtype))
        self.cache.add_sequence(0)  # the system prompt, its full blocks named by their token ids
        for i in range(0, len(system), opts.max_step):
            chunk = system[i : i + opts.max_step]
            with self.cache.step([(0, len(chunk), chunk)]) as step:
                self.model.forward_batch(chunk, step, self.pool)

    def run(self, prefilled: list[Any]) -> dict[str, Any]:
        """Imports each chat's record (Ray object refs, fetched here without a copy) and
        decodes every chat gen_len tokens, greedily; their tokens and logits."""
        import ray

        # Blocks written are counted in the flat group (a ring group frees blocks behind its window); none
        # without a flat layer.
        flat = next((g for g in range(self.cache.n_groups) if self.cache.group_policy(g) == kvcore.Flat()), None)
        held_before = 0 if flat is None else self.cache.held_blocks(flat)
        record_bytes, last = 0, []
        for i, ref in enumerate(prefilled):
            record, logits = ray.get(ref)
            record_bytes += record.nbytes
            # Trusted: the prefill worker is this deployment's own, so its token ids may
            # name blocks and share the system prompt's (docs/state.md "Trust").
            import_sequence(self.pool, i + 1, record, trust_tokens=True)
            last.append(logits)
        written = None if flat is None else self.cache.held_blocks(flat) - held_before
        seqs = list(range(1, len(prefilled) + 1))
        tokens = [[int(np.argmax(lg))] for lg in last]
        logits_out: list[list[Array]] = [[] for _ in seqs]
        for _ in range(self.opts.gen_len):
            step_tokens = [t[-1] for t in tokens]
            with self.cache.step([(s, 1, [tok]) for s, tok in zip(seqs, step_tokens)]) as step:
                logits = self.model.forward_batch(step_tokens, step, self.pool)
            for i in range(len(seqs)):
                logits_out[i].append(logits[i])
                tokens[i].append(int(np.argmax(logits[i])))
        return {"tokens": tokens, "logits": [np.stack(x) for x in logits_out], "record_bytes": record_bytes,
                "flat_blocks_written": written}


def reference(opts: DisaggregatedOptions, prompt: list[int]) -> tuple[list[int], Array]:
    """One chat decoded alone in this process: its tokens and the logits of its decode steps."""
    dec = Decoder(opts.model(), opts.capacity, opts.max_step, kv_dtype(opts.dtype))
    tokens = [int(np.argmax(dec.feed(prompt)[-1]))]
    logits = []
    for _ in range(opts.gen_len):
        lg = dec.step([tokens[-1]])[-1]
        logits.append(lg)
        tokens.append(int(np.argmax(lg)))
    return tokens, np.stack(logits)


def run_disaggregated(opts: DisaggregatedOptions) -> dict[str, Any]:
    """Runs the demo on Ray and checks it; a report (``ok`` False names what differed).
    Raises what DisaggregatedOptions.check raises, before Ray starts."""
    import ray

    opts.check()
    started = not ray.is_initialized()
    if started:
        ray.init(address=opts.address, num_cpus=None if opts.address else 2, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    try:
        system, prompts = make_prompts(opts)
        # Actors take no CPU slot: three of them share a local instance of two CPUs.
        prefill_actor: Any = ray.remote(num_cpus=0)(Prefill)
        decode_actor: Any = ray.remote(num_cpus=0)(Decode)
        prefills = [prefill_actor.remote(opts) for _ in range(opts.prefill_actors)]
        decoder = decode_actor.remote(opts, system)
        refs = [prefills[i % len(prefills)].prefill.remote(p) for i, p in enumerate(prompts)]
        out: dict[str, Any] = ray.get(decoder.run.remote(refs))
    finally:
        if started:
            ray.shutdown()
    problems = []
    for i, prompt in enumerate(prompts):
        want_tokens, want_logits = reference(opts, prompt)
        if out["tokens"][i] != want_tokens:
            problems.append(f"chat {i}: tokens differ from single-process decoding")
        elif not np.allclose(out["logits"][i], want_logits, atol=TOLERANCE[opts.dtype], rtol=0):
            problems.append(f"chat {i}: logits differ by {np.abs(out['logits'][i] - want_logits).max():.3g}")
    shared = opts.system_len // opts.block_size
    per_chat = -(-(opts.system_len + opts.prompt_len) // opts.block_size)
    return {
        "ok": not problems,
        "problems": problems,
        "chats": opts.chats,
        "prefill_actors": opts.prefill_actors,
        "record_bytes": out["record_bytes"],
        "flat_blocks_written": out["flat_blocks_written"],  # None: the model has no flat layer
        "flat_blocks_without_sharing": None if out["flat_blocks_written"] is None else per_chat * opts.chats,
        "system_blocks_shared_per_chat": shared,
    }


def format_report(r: dict[str, Any]) -> str:
    """The report as text."""
    blocks = ("no flat layer" if r["flat_blocks_written"] is None else
              f"flat-group blocks written on import: {r['flat_blocks_written']} "
              f"(without sharing the system prompt: {r['flat_blocks_without_sharing']})")
    lines = [
        f"{r['chats']} chats prefilled on {r['prefill_actors']} Ray actors, decoded together on one",
        f"records moved: {r['record_bytes']} bytes; {blocks}",
        "tokens and logits equal single-process decoding" if r["ok"] else "MISMATCH: " + "; ".join(r["problems"]),
    ]
    return "\n".join(lines)
