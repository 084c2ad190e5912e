"""``kvcore demo --model NAME``'s decoding: a real trained model's text through kvcore.

The model (kvcore.integrations.transformers_models: Gemma 3 270M, converted once and cached) runs
in transformers with ``KVCoreCache`` (kvcore.integrations.transformers): one
``SequenceCache`` plans every forward, the K/V live in kvcore's torch byte layer
(``TorchKVPool``), sliding layers hold ``window + max_step - 1`` rows. The prompt
is prefilled in chunks of at most ``max_step`` tokens, then the model decodes
greedily one token per forward until ``gen_len`` tokens or its end-of-text token.

The check is the one ``kvcore demo`` makes: the logits the cached run produced
(the last position of every prefill chunk and every decode step) against a full
recomputation of the same tokens with no cache at all (one forward over the
whole sequence, transformers' own masks). With ``draft`` it decodes again with
prompt-lookup drafts and rewinds, with ``tree`` with early-exit draft trees and chains
(kvcore_demo.real_trees); both must give plain decoding's tokens. The run and its
report: kvcore_demo.real_run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from kvcore.integrations import transformers_models as real_model
from kvcore_demo.runner import Progress, check_entry

#: An original passage of about 690 Gemma tokens, longer than Gemma 3's 512-token
#: sliding window: the default prompt's body, and the batch demo's system prompt.
PASSAGE = (
    "The lighthouse on the northern cape was built in the spring of a dry year, when the fishing fleet had "
    "lost three boats on the reef in a single winter. The builders came from the town across the bay. They "
    "brought stone by cart along the cliff road, which was so narrow that the carts had to be unloaded at the "
    "bend and carried the last mile by hand. The keeper who first lit the lamp was a former sailor named "
    "Tomas, who had sailed on merchant ships for twenty years before a storm broke his leg and sent him home. "
    "He kept a logbook in which he wrote the weather, the ships he saw, and the oil he burned each night. "
    "The logbook survives, and from it we know that in the first year he saw four hundred and twelve ships, "
    "that the lamp burned eleven gallons of oil in the longest week of winter, and that on one night in "
    "November the fog was so thick that he rang the bell by hand from dusk until dawn. "
    "In the second year Tomas married the schoolteacher from the town, a woman named Elena who had come "
    "from the capital to teach reading and arithmetic to the children of the fishermen. She moved into the "
    "keeper's cottage and began to keep a second book, a record of the birds that struck the lantern glass "
    "during the autumn migration. Her book lists thrushes, warblers, a single owl, and once, after a gale, a "
    "heron that walked into the kitchen and refused to leave for two days. Elena also taught Tomas to read "
    "the scientific journals that arrived by post, and together they began to measure the height of the "
    "tides and the temperature of the sea, sending their figures to the observatory in the capital. "
    "The observatory wrote back that the figures were the most careful it had received from any station on "
    "the coast. A young astronomer travelled north to meet the keepers and stayed for a month. He set up a "
    "small telescope on the gallery of the tower and taught them to time the moons of Jupiter, which allowed "
    "them to set the lighthouse clock more exactly than any clock in the town. For many years afterwards the "
    "fishermen set their watches by the lighthouse, and the church in the town rang its bell at noon only "
    "after the keeper had raised a flag on the tower. "
    "When Tomas grew old, his daughter Marta took over the lamp. She had grown up on the cape and knew every "
    "rock of the reef by its shape at low water. She replaced the oil lamp with a brighter one that burned "
    "paraffin, and later she wrote to the harbour board every year for ten years until they agreed to pay for "
    "a foghorn. The foghorn was installed in the year of the great storm, and on the night of the storm it "
    "sounded for thirty hours without a pause. Every boat of the fleet came home. The people of the town "
    "still tell the story of that night, and of Marta standing at the top of the tower with a lantern in "
    "each hand, counting the boats as they passed the point. "
    "The lighthouse was automated many years later, and the cottage became a small museum. Visitors can read "
    "the three books, the weather, the birds and the tides, in a glass case by the window. On clear evenings "
    "the museum opens the gallery at the top of the tower, and the guide, who is Marta's grandson, points out "
    "the places where the boats were lost, the road the builders used, and the rock where the heron stood."
)
#: The default prompt: the passage and a sentence the model continues (703 tokens: the
#: window wraps during prefill).
DEFAULT_PROMPT = PASSAGE + " Then he tells the visitors what happened to the lighthouse in the end. He says that"


@dataclasses.dataclass(frozen=True)
class RealDemoOptions:
    """Knobs of ``kvcore demo --model NAME``: the model (a key of real_model.MODELS),
    the prompt text, tokens to generate at most (fewer when the model ends its text),
    the largest forward (``max_step``, tokens: prefill chunks are this long), the
    prompt-lookup drafts per speculative forward (0: no speculative run) and the
    tokens of a draft tree per forward (0: no tree run; kvcore_demo.real_trees) and the
    layers of its early-exit drafter (0: ``default_draft_layers``)."""

    model: str = "gemma-3-270m"
    prompt: str = DEFAULT_PROMPT
    gen_len: int = 40
    max_step: int = 64
    draft: int = 3
    tree: int = 0
    draft_layers: int = 0

    def check(self) -> None:
        """Raises ValueError naming the first bad option: an unknown model, an empty
        prompt, a count below 1, drafts that do not fit a forward, or a tree budget
        other than 0 (no trees) or 2 .. max_step."""
        real_model.check_name(self.model)
        if not self.prompt.strip():
            raise ValueError("--prompt is empty: give the text the model continues")
        for name in ("gen_len", "max_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)}: must be >= 1")
        if not 0 <= self.draft <= self.max_step - 1:
            raise ValueError(f"--draft = {self.draft}: must be in [0, --max-step - 1 = {self.max_step - 1}] (a "
                             "speculative forward carries the last token and its drafts)")
        if self.tree != 0 and not 2 <= self.tree <= self.max_step:
            raise ValueError(f"--tree = {self.tree}: must be 0 (no trees) or in [2, --max-step = {self.max_step}] "
                             "(a tree of N tokens, the root included, is verified in one forward)")
        layers = real_model.LAYERS[self.model]
        if self.draft_layers != 0 and self.tree == 0:
            raise ValueError(f"--draft-layers = {self.draft_layers}: sets the tree drafter's depth; give --tree N too")
        if self.draft_layers != 0 and not 1 <= self.draft_layers <= layers - 1:
            raise ValueError(f"--draft-layers = {self.draft_layers}: must be in [1, {layers - 1}] (a drafter of "
                             f"{self.model}'s first layers, fewer than its {layers})")

    @property
    def tree_draft_layers(self) -> int:
        """The tree drafter's layers: `draft_layers`, or by default ``default_draft_layers``."""
        return self.draft_layers or default_draft_layers(real_model.LAYERS[self.model])


def default_draft_layers(layers: int) -> int:
    """The early-exit drafter's default depth for a real model of `layers` layers: all but the
    last sixth (15 of Gemma 3 270M's 18). Shallower exits of a model not trained for early exit
    draft almost nothing its full depth agrees with (bench/gemma_drafts.py measures depths)."""
    return max(1, layers - layers // 6)


#: Largest |logit difference| accepted between the cached run and the recomputation.
#: Both are float32, but a chunk of the cached run and the whole-sequence forward sum
#: in different orders (other matrix shapes, other sdpa kernels): the default run
#: differs by about 3e-5 on logits of magnitude ~30, a wrong K/V row by far more.
TOLERANCE = 1e-3


@dataclasses.dataclass
class Decoded:
    """What a cached run produced: the prompt's token ids, the generated ids, the
    logits it computed (position -> a vocabulary-sized float32 row), the cache, and
    the seconds of prefill and decode."""

    prompt_ids: list[int]
    tokens: list[int]
    logits: dict[int, Any]
    cache: Any
    prefill_seconds: float
    decode_seconds: float

    @property
    def fed(self) -> list[int]:
        """Every token fed to the model: the prompt and the generated tokens but the last."""
        return self.prompt_ids + self.tokens[:-1]


@dataclasses.dataclass
class Prefilled:
    """A prompt prefilled through a ``KVCoreCache``: its token ids, the cache, the logits of
    every chunk's last position (position -> row) and the seconds it took."""

    prompt_ids: list[int]
    cache: Any
    logits: dict[int, Any]
    seconds: float

    def copy(self) -> Prefilled:
        """An independent copy (the cache deep-copied), to decode twice from one prefill."""
        return Prefilled(list(self.prompt_ids), copy.deepcopy(self.cache), dict(self.logits), self.seconds)


def new_cache(loaded: real_model.LoadedModel, opts: RealDemoOptions, prompt_len: int) -> Any:
    """The demo's empty ``KVCoreCache`` for a prompt of `prompt_len` tokens: steps of at most
    `opts.max_step` (at most the capacity), room for `opts.gen_len` tokens and one step of drafts
    (or a tree) after it, compact
    rings (no mirror: a sliding layer holds window + max_step - 1 rows, which the report
    counts; a wrapped window is gathered into the workspace instead)."""
    from kvcore.integrations.transformers import KVCoreCache

    capacity = prompt_len + opts.gen_len + max(opts.draft, opts.tree)
    # A forward never carries more than the whole sequence: a short --prompt takes smaller steps.
    return KVCoreCache(loaded.model.config, max_step=min(opts.max_step, capacity), capacity=capacity,
                       mirror_rings=False)  # fmt: skip


def prefill_prompt(loaded: real_model.LoadedModel, opts: RealDemoOptions, progress: Progress | None = None) -> Prefilled:
    """Tokenizes `opts.prompt` and prefills it in chunks of `opts.max_step` tokens through a
    new ``KVCoreCache`` with room for `opts.gen_len` tokens and one step of drafts."""
    import torch

    from kvcore.integrations.transformers import prefill

    bar = progress or Progress(None)
    prompt_ids = [int(t) for t in loaded.tokenizer(opts.prompt).input_ids]
    n = len(prompt_ids)
    cache = new_cache(loaded, opts, n)
    logits: dict[int, Any] = {}
    start_time = time.perf_counter()
    with torch.no_grad():
        for start in range(0, n, opts.max_step):
            chunk = torch.tensor([prompt_ids[start : start + opts.max_step]])
            out = prefill(loaded.model, cache, chunk, logits_to_keep=1)
            logits[start + chunk.shape[1] - 1] = out.logits[0, -1].float()
            bar.update("prefill", min(start + opts.max_step, n), n)
    return Prefilled(prompt_ids, cache, logits, time.perf_counter() - start_time)


def decode(
    loaded: real_model.LoadedModel,
    opts: RealDemoOptions,
    progress: Progress | None = None,
    prefilled: Prefilled | None = None,
) -> Decoded:
    """Decodes greedily from `prefilled` (default: `opts.prompt` prefilled now), one token
    per forward, until `opts.gen_len` tokens or the model's end-of-text token; keeps the
    logits of every chunk's last position and of every decode step."""
    import torch

    from kvcore.integrations.transformers import prefill

    bar = progress or Progress(None)
    start = prefilled or prefill_prompt(loaded, opts, bar)
    eos, n, logits = loaded.tokenizer.eos_token_id, len(start.prompt_ids), start.logits
    t1 = time.perf_counter()
    tokens = [int(logits[n - 1].argmax())]
    with torch.no_grad():
        while len(tokens) < opts.gen_len and tokens[-1] != eos:
            out = prefill(loaded.model, start.cache, torch.tensor([tokens[-1:]]), logits_to_keep=1)
            logits[n + len(tokens) - 1] = out.logits[0, -1].float()
            tokens.append(int(logits[n + len(tokens) - 1].argmax()))
            bar.update("decode", len(tokens), opts.gen_len)
    return Decoded(start.prompt_ids, tokens, logits, start.cache, start.seconds, time.perf_counter() - t1)


def prompt_lookup_drafts(tokens: list[int], k: int, max_ngram: int = 3) -> list[int]:
    """Up to `k` draft tokens by prompt lookup: the tokens that followed the latest earlier
    occurrence of the last n tokens of `tokens`, trying n = `max_ngram` down to 1; none
    when no n-gram recurs. A drafter with no model: it wins where the text repeats its
    context, and loses where it does not (the default run: 7 of 85 drafts accepted)."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []


def decode_speculative(
    loaded: real_model.LoadedModel,
    opts: RealDemoOptions,
    start: Prefilled,
    progress: Progress | None = None,
    drafter: Callable[[list[int], int], list[int]] | None = None,
    draft: int | None = None,
) -> tuple[Decoded, dict[str, Any]]:
    """Greedy decoding from `start` with up to `draft` (default `opts.draft`) drafts per
    forward from `drafter(context, k)` (default: prompt lookup; `context` is every token
    so far, the last one not in the cache yet; it returns at most `k` token ids): each
    forward carries the last token and its drafts, the drafts greedy decoding agrees
    with are kept and the cache is rewound past the others (``KVCoreCache.rewind``). Its
    tokens must equal plain greedy decoding's. Returns the run (logits of every kept
    position) and its counts: forwards, drafted, accepted and rewinds."""
    import torch

    from kvcore.integrations.transformers import prefill

    bar = progress or Progress(None)
    propose = drafter or prompt_lookup_drafts
    k = opts.draft if draft is None else draft
    eos, n, logits, cache = loaded.tokenizer.eos_token_id, len(start.prompt_ids), start.logits, start.cache
    t1 = time.perf_counter()
    out = [int(logits[n - 1].argmax())]
    forwards = drafted = accepted = rewinds = 0
    with torch.no_grad():
        while len(out) < opts.gen_len and out[-1] != eos:
            drafts = propose(start.prompt_ids + out, min(k, opts.gen_len - len(out)))
            P = cache.get_seq_length()
            rows = prefill(loaded.model, cache, torch.tensor([[out[-1], *drafts]])).logits[0].float()
            greedy = rows.argmax(-1).tolist()
            a = 0
            while a < len(drafts) and greedy[a] == drafts[a] and drafts[a] != eos:
                a += 1
            for j in range(a + 1):
                logits[P + j] = rows[j]
            out += [*drafts[:a], int(greedy[a])]
            if a < len(drafts):
                cache.rewind(P + 1 + a)
                rewinds += 1
            forwards, drafted, accepted = forwards + 1, drafted + len(drafts), accepted + a
            bar.update("speculative", min(len(out), opts.gen_len), opts.gen_len)
    if eos in out:
        out = out[: out.index(eos) + 1]
    out = out[: opts.gen_len]
    fed = len(start.prompt_ids) + len(out) - 1
    kept = {p: row for p, row in logits.items() if p < fed}
    run = Decoded(start.prompt_ids, out, kept, cache, start.seconds, time.perf_counter() - t1)
    return run, {"forwards": forwards, "drafted": drafted, "accepted": accepted, "rewinds": rewinds}


def check_against_recomputation(model: Any, decoded: Decoded, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """The check entry (runner.check_entry) comparing `decoded`'s logits with one
    forward of `model` over every token it was fed, with no cache."""
    import torch

    positions = sorted(decoded.logits)
    with torch.no_grad():
        full = model(input_ids=torch.tensor([decoded.fed]), use_cache=False,
                     logits_to_keep=torch.tensor(positions)).logits[0].float()  # fmt: skip
    ours = torch.stack([decoded.logits[p] for p in positions])
    diff = float((ours - full).abs().max())
    same = bool(torch.equal(ours.argmax(-1), full.argmax(-1)))
    return check_entry(
        "logits equal a full recomputation without cache",
        diff <= tolerance and same,
        f"max |diff| {diff:.2e} at {len(positions)} positions of {len(decoded.fed)}, tolerance {tolerance:.0e}, "
        f"greedy tokens {'equal' if same else 'DIFFER'}",
    )


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Runs the body with torch on `n` threads, restoring its setting after. One thread:
    on two shared cores a second one made this model's forwards 5 to 10 times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["DEFAULT_PROMPT", "PASSAGE", "TOLERANCE", "Decoded", "RealDemoOptions", "Prefilled", "check_against_recomputation", "decode", "decode_speculative",
           "new_cache", "prefill_prompt", "prompt_lookup_drafts", "torch_threads"]  # fmt: skip
