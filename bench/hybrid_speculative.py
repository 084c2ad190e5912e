"""Exact speculative decoding on hybrid models (issue 30): speed, acceptance, state writes, cache bytes.

Speed section: two tiny random models shaped like the hybrids transformers refuses assisted
generation for (float32, CPU, torch on one thread, hidden size 64, ``initializer_range`` 0.02):

- **Qwen3-Next**: 4 layers, three gated-DeltaNet (``linear_attention``) layers to one full
  attention layer (the real model's 3 : 1), a 4-expert MoE;
- **Granite 4.0-H**: 4 layers, three Mamba-2 layers to one attention layer (the real models
  are mostly Mamba-2), a 4-expert MoE, Granite's embedding x12 and residual x0.22 multipliers.

The prompt is a random 16-token pattern repeated (``--repeats`` times, then its first 5
tokens, 101 tokens by default). Random weights do not continue the pattern, but these two fall
into a short cycle of their own within a few dozen tokens, which prompt lookup then matches:
its best case. ``qwen3_next_noloop`` (``initializer_range`` 0.1) and ``granite_noloop`` (0.05,
multipliers 1) are the same shapes with weights whose greedy continuation does not repeat: the
drafts prompt lookup finds are rejected, its worst case. Per model (1 and 2; 3 on ten models):

1. **tokens per second** (``--new`` tokens after the prompt, prefill included, cache built
   inside the timed region) of
   - ``prompt_lookup_generate`` through a ``KVCoreCache`` (``--drafts`` drafts per verify
     step, each value a candidate),
   - ``speculative_generate`` with 0 drafts: the same loop, plain greedy (one token per verify
     step),
   - ``model.generate`` greedy through a ``KVCoreCache``,
   - ``model.generate`` greedy with transformers' own cache (``DynamicCache``): the only
     decoding transformers offers these models (it refuses prompt lookup and assisted
     generation on models it marks stateful),

   run ``--reps`` times, interleaved (one run of each candidate per round), medians reported.
   Every run's tokens are checked equal to the ``DynamicCache`` greedy run's (the exactness
   claim; the script exits 1 if any differs).
2. **acceptance**: drafts proposed and accepted per verify step, and tokens per forward
   (``--new`` over every forward of the target model, prefill included: 1.0 for plain
   greedy). **State bytes written**: each write of the cache's state slots
   (``TorchStateSlots.write_states``) counted as slots kept x bytes per slot (the stored
   tensor's bytes over its ``D`` slots; ``prepare``'s slot, which an in-place kernel writes,
   counted too; each slot once per step), split into verify steps' writes and other forwards';
   plus the copies ``TorchStateSlots.prepare`` makes (the previous state copied into that slot
   first). Plain greedy writes one slot per state layer and state per token; a verify step of
   ``T`` tokens keeps the state after each of its ``T`` tokens.
3. **cache bytes** (``--bytes-models``: tiny random models of all ten architectures
   ``KVCoreCache`` serves, the two above and Llama 4 (chunked attention, chunks of 8192),
   Gemma 3n (sliding window 512, KV-shared layers), Qwen 3.5, LFM2, Falcon-H1, Jamba, Bamba,
   Nemotron-H; each 4 layers of hidden size 64, float32, sdpa) after a chunked prefill
   (``--max-step`` tokens a forward; ``kvcore.integrations.transformers.prefill`` for kvcore,
   the same chunks and positions straight through the model for ``DynamicCache``) of
   ``--contexts`` tokens (random ids), ``KVCoreCache`` against ``DynamicCache``: K/V bytes
   (``KVCoreCache.pool.nbytes()``: allocated rows, sliding / chunked layers' mirrors included;
   DynamicCache: the storages behind its K/V tensors, each once, since a sliding layer's
   tensors are views keeping the last chunk's ``torch.cat`` alive), state bytes
   (``cache.state.nbytes()``: D slots per state layer; DynamicCache: its conv and recurrent
   tensors), and kvcore's gather workspace (in kvcore's total). Both caches only grow during a
   prefill, so what they hold at its end is their peak (DynamicCache's sliding layers hold
   ``window - 1`` + the last chunk's rows: their peak when the last chunk is a full
   ``--max-step``, as at 4K and 16K in 512-token chunks). Not counted: the transient copies of
   a growing layer (DynamicCache's ``torch.cat`` briefly holds a layer's old and new tensors,
   kvcore's doubling its old and new rows), activations, and what a later decode step frees
   (DynamicCache's sliding layers then shrink to ``window`` rows). The two prefills' last
   logits are compared (recorded; Jamba: see ``NOTES``). Where a ring wrapped (its mirror
   holds rows), the prefill is repeated with ``mirror_rings=False`` (``kvcore_mirror_rings_false``:
   no mirror, but a wrapped window is gathered into the workspace).

    python bench/hybrid_speculative.py [--new 128] [--reps 3] [--drafts 3,7] [--contexts 4096,16384]
        [--models qwen3_next,granite,qwen3_next_noloop,granite_noloop] [--bytes-models llama4,...|""]
        [--out FILE.json]

``--models ""`` runs only the bytes section, ``--bytes-models ""`` only the speed section.

Needs torch and transformers (pip install kvcore[transformers]). Timings depend on the machine
and its load; the JSON records the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import transformers

from kvcore.integrations.transformers import KVCoreCache, cache_keyword, prefill
from kvcore.integrations.transformers_speculative import prompt_lookup_generate, speculative_generate
from kvcore.torch.state_slots import TorchStateSlots

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import int_list, loadavg  # noqa: E402

VOCAB = 256


def no_eos(model: Any) -> Any:
    """Generation runs its full length: random models hit their eos id early."""
    model.generation_config.eos_token_id = None
    return model


def qwen3_next(max_positions: int, init: float = 0.02, seed: int = 0) -> Any:
    """Qwen3-Next-shaped: [linear, linear, linear, full] (full_attention_interval 4), MoE."""
    config = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        max_position_embeddings=max_positions, full_attention_interval=4, initializer_range=init,
    )  # fmt: skip
    torch.manual_seed(seed)
    return no_eos(transformers.Qwen3NextForCausalLM(config).eval())


def granite(max_positions: int, init: float = 0.02, multipliers: bool = True, seed: int = 0) -> Any:
    """Granite-4.0-H-shaped: [mamba, mamba, mamba, attention], Mamba-2 mixers, MoE; ``multipliers``:
    Granite's embedding x12 and residual x0.22 (else 1 and 1)."""
    config = transformers.GraniteMoeHybridConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_positions,
        layer_types=["mamba", "mamba", "mamba", "attention"], mamba_n_heads=8, mamba_n_groups=1,
        mamba_d_state=16, mamba_d_head=16, mamba_d_conv=4, mamba_expand=2, num_local_experts=4,
        num_experts_per_tok=2, shared_intermediate_size=64, mamba_chunk_size=64, initializer_range=init,
        embedding_multiplier=12.0 if multipliers else 1.0, residual_multiplier=0.22 if multipliers else 1.0,
    )  # fmt: skip
    torch.manual_seed(seed)
    return no_eos(transformers.GraniteMoeHybridForCausalLM(config).eval())


# The speed section's models (name -> builder). The first two: random weights whose greedy continuation
# falls into a short cycle (prompt lookup's best case); the "_noloop" ones: weights whose continuation
# does not repeat within --new tokens (drafts found in the prompt, mostly rejected: its worst case).
MODELS: dict[str, Callable[[int], Any]] = {
    "qwen3_next": qwen3_next,
    "granite": granite,
    "qwen3_next_noloop": lambda n: qwen3_next(n, init=0.1),
    "granite_noloop": lambda n: granite(n, init=0.05, multipliers=False),
}


# --- the bytes section's other eight architectures (tiny, random, float32) ----------------
# Shaped like the two above (hidden size 64, 4 layers, two KV heads where the model has a head count
# of its own); each in its real model's proportions where 4 layers allow. The window / chunk are the
# real models' (Gemma 3n: 512, Llama 4: 8192): they decide what the sliding / chunked layers hold.
def tiny(model_class: Any, config: Any, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return no_eos(model_class(config).eval())


ATTN = dict(num_attention_heads=4, num_key_value_heads=2)
MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
              mamba_chunk_size=64)  # fmt: skip


def llama4(n: int) -> Any:
    """Llama-4-shaped: [chunked, chunked, chunked, full NoPE] (chunks of 8192), a 2-expert MoE; sdpa."""
    return tiny(transformers.Llama4ForCausalLM, transformers.Llama4TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, intermediate_size_mlp=128, num_hidden_layers=4, **ATTN,
        head_dim=16, attention_chunk_size=8192, num_local_experts=2, max_position_embeddings=n, floor_scale=4,
        attn_implementation="sdpa", pad_token_id=0, eos_token_id=1, bos_token_id=2))  # fmt: skip


def gemma3n(n: int) -> Any:
    """Gemma-3n-shaped: [sliding, full, sliding, full] (window 512), the last two reading layers 0 and 1's
    K/V (``num_kv_shared_layers`` 2; the real model shares 15 of 35); sdpa."""
    types = ["sliding_attention", "full_attention"] * 2
    return tiny(transformers.Gemma3nForCausalLM, transformers.Gemma3nTextConfig(
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=64, hidden_size_per_layer_input=8,
        intermediate_size=128, num_hidden_layers=4, **ATTN, head_dim=16, sliding_window=512, layer_types=types,
        num_kv_shared_layers=2, laurel_rank=4, altup_num_inputs=2, activation_sparsity_pattern=[0.0] * 4,
        max_position_embeddings=n, attn_implementation="sdpa"))  # fmt: skip


def qwen3_5(n: int) -> Any:
    """Qwen-3.5-shaped: [linear, linear, linear, full] (gated DeltaNet : full attention 3 : 1), dense MLP."""
    return tiny(transformers.Qwen3_5ForCausalLM, transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, **ATTN, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, max_position_embeddings=n, initializer_range=0.02,
        layer_types=["linear_attention"] * 3 + ["full_attention"]))  # fmt: skip


def lfm2(n: int) -> Any:
    """LFM2-shaped: [conv, conv, full, conv] (short convolutions, cache length 3)."""
    return tiny(transformers.Lfm2ForCausalLM, transformers.Lfm2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, **ATTN,
        max_position_embeddings=n, conv_L_cache=3, initializer_range=0.02,
        layer_types=["conv", "conv", "full_attention", "conv"]))  # fmt: skip


def falcon_h1(n: int) -> Any:
    """Falcon-H1-shaped: every layer attention and a Mamba-2 mixer side by side (4 "hybrid" layers)."""
    return tiny(transformers.FalconH1ForCausalLM, transformers.FalconH1Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, **ATTN, head_dim=16,
        max_position_embeddings=n, mamba_d_ssm=128, **MAMBA2, initializer_range=0.02))  # fmt: skip


def jamba(n: int) -> Any:
    """Jamba-shaped: [mamba, mamba, mamba, attention] (Mamba-1 mixers), a 4-expert MoE every other layer."""
    return tiny(transformers.JambaForCausalLM, transformers.JambaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, **ATTN,
        max_position_embeddings=n, attn_layer_period=4, attn_layer_offset=3, expert_layer_period=2,
        expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_dt_rank=4, initializer_range=0.02))  # fmt: skip


def bamba(n: int) -> Any:
    """Bamba-shaped: [mamba, mamba, mamba, attention] (Mamba-2 mixers), dense MLP."""
    return tiny(transformers.BambaForCausalLM, transformers.BambaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, **ATTN,
        max_position_embeddings=n, attn_layer_indices=[3], **MAMBA2, initializer_range=0.02))  # fmt: skip


def nemotron_h(n: int) -> Any:
    """Nemotron-H-shaped: "M-M*" (Mamba-2, MLP, Mamba-2, attention: the MLP layer holds nothing)."""
    return tiny(transformers.NemotronHForCausalLM, transformers.NemotronHConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, **ATTN, head_dim=16,
        max_position_embeddings=n, hybrid_override_pattern="M-M*", mamba_num_heads=8, mamba_head_dim=16,
        n_groups=1, ssm_state_size=16, conv_kernel=4, expand=2, chunk_size=64, initializer_range=0.02))  # fmt: skip


# Recorded with a model's bytes: what its logits comparison does and does not show.
NOTES = {
    "jamba": "transformers' Jamba scans a multi-token forward after a cached prefix from a zero state (a "
    "transformers bug): both caches run that same code, so their last logits agree with each other, not "
    "necessarily with one unchunked forward; the bytes are unaffected",
}

# The bytes section's models: every architecture KVCoreCache serves (the issue's ten).
BYTES_MODELS: dict[str, Callable[[int], Any]] = {
    "llama4": llama4, "gemma3n": gemma3n, "qwen3_next": qwen3_next, "qwen3_5": qwen3_5, "lfm2": lfm2,
    "granite": granite, "falcon_h1": falcon_h1, "jamba": jamba, "bamba": bamba, "nemotron_h": nemotron_h,
}  # fmt: skip


def repetitive_prompt(repeats: int, seed: int = 1) -> torch.Tensor:
    """A random 16-token pattern repeated ``repeats`` times, then its first 5 tokens."""
    pattern = torch.randint(3, VOCAB, (1, 16), generator=torch.Generator().manual_seed(seed))
    return torch.cat([pattern] * repeats + [pattern[:, :5]], dim=1)


def describe(model: Any) -> dict[str, Any]:
    text = model.config.get_text_config(decoder=True)
    types = list(getattr(text, "layer_types", []) or [])
    return {"model_type": text.model_type, "layers": int(text.num_hidden_layers), "layer_types": types,
            "hidden_size": int(text.hidden_size), "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(next(model.parameters()).dtype),
            "attn_implementation": getattr(text, "_attn_implementation", None)}  # fmt: skip


# --- state writes -------------------------------------------------------------------------


class StateWrites:
    """Counts the state slots a KVCoreCache's forwards write, and their bytes: the slots
    ``TorchStateSlots.write_states`` keeps and the slot ``TorchStateSlots.prepare`` hands an in-place
    kernel (which writes the new state there), each slot once per step, split by whether the step
    is a verify step; and, separately, ``prepare``'s copies of the previous state into that slot.
    Wraps the two methods on one ``TorchStateSlots`` instance."""

    def __init__(self, cache: KVCoreCache) -> None:
        self.written: dict[tuple[int, int, str, int], tuple[bool, int]] = {}  # (step position, layer, name, slot)
        self.prepare_copy_bytes = 0
        state = cache.state
        write_states, prepare = state.write_states, state.prepare

        def slot_bytes(layer: int, name: str) -> int:
            t = state.tensor(layer, name)
            return 0 if t is None else t.numel() * t.element_size() // state.slots(layer)

        def mark(layer: int, name: str, slot: int) -> None:
            step = cache.sequence.active_step
            if step is None:  # not reached: state calls come inside a forward's step
                raise RuntimeError("a state write outside a step")
            self.written[(int(step.position), layer, name, slot)] = (bool(step.verify), slot_bytes(layer, name))

        def counted_write(layer: int, name: str, span: Any, states: torch.Tensor) -> Optional[torch.Tensor]:
            out = write_states(layer, name, span, states)
            start = span.first + span.count - int(states.shape[1])
            for q, slot in span.keep:
                if q >= start:
                    mark(layer, name, slot)
            return out

        def counted_prepare(layer: int, name: str, span: Any) -> torch.Tensor:
            out = prepare(layer, name, span)
            target = span.last_slot
            mark(layer, name, target)
            if span.first > 0 and span.read != target:
                self.prepare_copy_bytes += slot_bytes(layer, name)
            return out

        state.write_states = counted_write  # type: ignore[method-assign]
        state.prepare = counted_prepare  # type: ignore[method-assign]

    def totals(self, verify: bool) -> tuple[int, int]:
        """(slots, bytes) written by verify steps (``verify``) or by the other forwards."""
        rows = [b for v, b in self.written.values() if v == verify]
        return len(rows), sum(rows)


def one_slot_bytes(state: TorchStateSlots) -> int:
    """Bytes of one slot of every state of every state layer (one token's state, all layers)."""
    total = 0
    for layer in state.layers:
        for name in state.names(layer):
            t = state.tensor(layer, name)
            if t is not None:
                total += t.numel() * t.element_size() // state.slots(layer)
    return total


# --- 1 and 2: speed, exactness, acceptance ------------------------------------------------


def speed(model: Any, ids: torch.Tensor, new: int, reps: int, drafts: Sequence[int], max_step: int) -> dict[str, Any]:
    keyword = cache_keyword(model)
    n = ids.shape[1]
    stats: dict[str, dict[str, Any]] = {}

    def kvcore(k: Optional[int]) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            cache = KVCoreCache(model.config, max_step=max_step)
            writes = StateWrites(cache)
            s: dict[str, Any] = {}
            if k is None:
                with torch.no_grad():
                    out = model.generate(ids, max_new_tokens=new, do_sample=False, **{keyword: cache})
            elif k == 0:
                out = speculative_generate(model, cache, ids, lambda t, m: [], max_new_tokens=new,
                                           num_draft_tokens=0, stats=s)  # fmt: skip
            else:
                out = prompt_lookup_generate(model, cache, ids, max_new_tokens=new, num_draft_tokens=k, stats=s)
            (vs, vb), (ps, pb) = writes.totals(True), writes.totals(False)
            s.update(verify_state_bytes=vb, verify_state_slots=vs, plain_state_bytes=pb, plain_state_slots=ps,
                     prepare_copy_bytes=writes.prepare_copy_bytes,
                     one_slot_bytes=one_slot_bytes(cache.state))  # fmt: skip
            stats[name_of(k)] = s
            return torch.as_tensor(out)

        return run

    def dynamic() -> torch.Tensor:
        with torch.no_grad():
            return torch.as_tensor(model.generate(ids, max_new_tokens=new, do_sample=False))

    def name_of(k: Optional[int]) -> str:
        return ("generate, KVCoreCache" if k is None else "speculative_generate, 0 drafts, KVCoreCache" if k == 0
                else f"prompt_lookup_generate, {k} drafts, KVCoreCache")  # fmt: skip

    candidates: dict[str, Callable[[], torch.Tensor]] = {"generate, DynamicCache": dynamic}
    for k in [None, 0, *drafts]:
        candidates[name_of(k)] = kvcore(k)
    reference = dynamic()  # warm-up, and the tokens every run must equal
    times: dict[str, list[float]] = {c: [] for c in candidates}
    equal: dict[str, bool] = {c: True for c in candidates}
    for _ in range(reps):
        for name, run in candidates.items():
            t0 = time.perf_counter()
            out = run()
            times[name].append(time.perf_counter() - t0)
            equal[name] = equal[name] and torch.equal(out, reference)
    base = statistics.median(times["generate, DynamicCache"])
    rows = []
    for name in candidates:
        med = statistics.median(times[name])
        row: dict[str, Any] = {"candidate": name, "seconds": [round(t, 4) for t in times[name]],
                               "median_s": round(med, 4), "tokens_per_s": round(new / med, 1),
                               "speedup_vs_dynamic_generate": round(base / med, 2),
                               "tokens_equal_greedy": equal[name]}  # fmt: skip
        s = stats.get(name)
        if s is not None:
            row["state_slot_bytes_per_token"] = s["one_slot_bytes"]
            if "forwards" in s:
                prefill_forwards = -(-n // max_step)
                verify_steps = s["forwards"] - prefill_forwards
                row.update(forwards=s["forwards"], verify_steps=verify_steps, drafted=s["drafted"],
                           accepted=s["accepted"],
                           drafted_per_verify_step=round(s["drafted"] / max(verify_steps, 1), 3),
                           accepted_per_verify_step=round(s["accepted"] / max(verify_steps, 1), 3),
                           acceptance_rate=round(s["accepted"] / max(s["drafted"], 1), 3),
                           tokens_per_forward=round(new / s["forwards"], 3),
                           state_bytes_per_verify_step=round(s["verify_state_bytes"] / max(verify_steps, 1)),
                           state_slots_per_verify_step=round(s["verify_state_slots"] / max(verify_steps, 1), 3),
                           prepare_copy_bytes_per_verify_step=round(s["prepare_copy_bytes"] / max(verify_steps, 1)),
                           state_bytes_per_generated_token=round(s["verify_state_bytes"] / new))  # fmt: skip
            else:  # generate: plain forwards, one state slot written per state layer and state per token
                row.update(plain_state_bytes=s["plain_state_bytes"], plain_state_slots=s["plain_state_slots"],
                           prepare_copy_bytes=s["prepare_copy_bytes"])  # fmt: skip
        rows.append(row)
        extra = (f"  {row['accepted_per_verify_step']:.2f} accepted/verify step, {row['tokens_per_forward']:.2f} "
                 f"tok/forward, {row['state_bytes_per_verify_step'] / 1024:.1f} KiB state written/verify step"
                 if "verify_steps" in row else "")  # fmt: skip
        print(f"  {name:46s} {row['tokens_per_s']:8.1f} tok/s  x{row['speedup_vs_dynamic_generate']:.2f}  "
              f"tokens {'equal' if equal[name] else 'DIFFER'}{extra}", flush=True)  # fmt: skip
    continuation = reference[0, n:].tolist()
    return {"prompt_tokens": n, "new_tokens": new, "reps": reps, "max_step": max_step,
            "prompt": ids[0].tolist(), "greedy_continuation": continuation, "rows": rows}  # fmt: skip


# --- 3: cache bytes -----------------------------------------------------------------------


def storage_bytes(obj: Any, seen: set[int]) -> int:
    """Bytes of the distinct storages behind every tensor reachable from ``obj`` (attributes, lists,
    tuples, dicts), each storage once: a sliced view keeps its whole storage alive (a DynamicCache
    sliding layer keeps the last ``window - 1`` rows as a view of the chunk's ``torch.cat``)."""
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return int(storage.nbytes())
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, dict):
        return sum(storage_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(storage_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return sum(storage_bytes(v, seen) for v in vars(obj).values())
    return 0


def view_bytes(obj: Any) -> int:
    """Bytes of the tensor(s) ``obj`` itself (a layer's ``keys`` or ``values``), not of their storages."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    return sum(view_bytes(v) for v in obj) if isinstance(obj, (list, tuple)) else 0


def dynamic_bytes(cache: Any) -> dict[str, Any]:
    """DynamicCache: the storages of its layers' K/V tensors and of their state tensors (conv, recurrent);
    also the K/V tensors' own bytes (``kv_view_bytes``) and each layer's class and K/V rows."""
    kv = state = kv_view = 0
    seen: set[int] = set()
    layers = []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        kv += storage_bytes(keys, seen) + storage_bytes(values, seen)
        kv_view += view_bytes(keys) + view_bytes(values)
        state += sum(storage_bytes(getattr(layer, a, None), seen) for a in ("conv_states", "recurrent_states"))
        row: dict[str, Any] = {"class": type(layer).__name__}
        if isinstance(keys, torch.Tensor) and keys.dim() == 4:  # [batch, heads, rows, head_dim]
            row_bytes = keys.shape[0] * keys.shape[1] * keys.shape[3] * keys.element_size()
            row.update(kv_rows=int(keys.shape[2]), kv_storage_rows=int(keys.untyped_storage().nbytes() // row_bytes))
        layers.append(row)
    return {"kv_bytes": kv, "state_bytes": state, "kv_view_bytes": kv_view, "layers": layers}


def memory(model: Any, context: int, max_step: int) -> dict[str, Any]:
    ids = torch.randint(3, VOCAB, (1, context), generator=torch.Generator().manual_seed(2))
    keyword = cache_keyword(model)
    out: dict[str, Any] = {"context": context, "max_step": max_step}
    with torch.no_grad():
        t0 = time.perf_counter()
        kc = KVCoreCache(model.config, max_step=max_step, capacity=context)
        logits_k = prefill(model, kc, ids).logits[0, -1]
        out["kvcore_prefill_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        dc = transformers.DynamicCache(config=model.config)
        for start in range(0, context, max_step):
            # position_ids as prefill passes them (Bamba's model would number each chunk from 0).
            chunk = ids[:, start : start + max_step]
            positions = torch.arange(start, start + chunk.shape[1])[None]
            logits_d = model(input_ids=chunk, position_ids=positions, use_cache=True, **{keyword: dc}).logits[0, -1]
        out["dynamic_prefill_s"] = round(time.perf_counter() - t0, 2)
    layers = []
    for i, layer in enumerate(kc.layers):
        kind = ("state" if layer in kc.state_layers else "shared" if layer in kc.shared_layers
                else "kv" if layer in kc.kv_layers else "none")  # fmt: skip
        row: dict[str, Any] = {"layer": i, "kind": kind, "bytes": kc.nbytes(i) if kind in ("kv", "state") else 0}
        if kind == "kv":
            allocated, mirror = kc.allocated_rows(i), kc.mirror_rows(i)
            row.update(rows=kc.rows(i), allocated_rows=allocated, mirror_rows=mirror,
                       mirror_bytes=row["bytes"] * mirror // max(allocated + mirror, 1))  # fmt: skip
        elif kind == "state":
            row["slots"] = layer.slots
        layers.append(row)
    state_bytes = kc.state.nbytes() if kc.state_layers else 0
    out["kvcore"] = {"kv_bytes": kc.pool.nbytes(), "state_bytes": state_bytes,
                     "workspace_bytes": int(kc.pool.workspace_nbytes), "length": kc.get_seq_length(),
                     "mirror_bytes": sum(r.get("mirror_bytes", 0) for r in layers), "layers": layers}  # fmt: skip
    k = out["kvcore"]
    k["total_bytes"] = k["kv_bytes"] + k["state_bytes"] + k["workspace_bytes"]
    out["dynamic"] = {**dynamic_bytes(dc), "length": dc.get_seq_length()}
    d = out["dynamic"]
    d["total_bytes"] = d["kv_bytes"] + d["state_bytes"]
    out["kvcore_over_dynamic_total"] = round(k["total_bytes"] / max(d["total_bytes"], 1), 3)
    out["last_logits_max_abs_diff"] = float((logits_k - logits_d).abs().max())
    if k["mirror_bytes"]:  # sliding / chunked rings that wrapped: the same prefill without their mirrors
        with torch.no_grad():
            plain = KVCoreCache(model.config, max_step=max_step, capacity=context, mirror_rings=False)
            logits_p = prefill(model, plain, ids).logits[0, -1]
        u: dict[str, Any] = {"kv_bytes": plain.pool.nbytes(), "workspace_bytes": int(plain.pool.workspace_nbytes),
                             "state_bytes": plain.state.nbytes() if plain.state_layers else 0}  # fmt: skip
        u["total_bytes"] = u["kv_bytes"] + u["state_bytes"] + u["workspace_bytes"]
        u["over_dynamic_total"] = round(u["total_bytes"] / max(d["total_bytes"], 1), 3)
        u["last_logits_max_abs_diff"] = float((logits_p - logits_d).abs().max())
        out["kvcore_mirror_rings_false"] = u
    print(f"  {context:6d} tokens: KVCoreCache K/V {k['kv_bytes'] / 2**20:.2f} MiB + state "
          f"{k['state_bytes'] / 2**10:.0f} KiB + workspace {k['workspace_bytes'] / 2**10:.0f} KiB; "
          f"DynamicCache K/V {d['kv_bytes'] / 2**20:.2f} MiB + state {d['state_bytes'] / 2**10:.0f} KiB; "
          f"total ratio {out['kvcore_over_dynamic_total']:.3f}; last logits differ by "
          f"{out['last_logits_max_abs_diff']:.1e} ({out['kvcore_prefill_s']} s / {out['dynamic_prefill_s']} s)",
          flush=True)  # fmt: skip
    if "kvcore_mirror_rings_false" in out:
        u = out["kvcore_mirror_rings_false"]
        print(f"         mirror_rings=False: K/V {u['kv_bytes'] / 2**20:.2f} MiB + workspace "
              f"{u['workspace_bytes'] / 2**10:.0f} KiB; total ratio {u['over_dynamic_total']:.3f}", flush=True)
    return out


def names(value: str, known: dict[str, Any], option: str) -> list[str]:
    """The comma-separated names of ``value`` ("" or "none": none), each checked against ``known``."""
    chosen = [] if value.strip() in ("", "none") else [n.strip() for n in value.split(",")]
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise SystemExit(f"{option}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return chosen


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"speed section: comma-separated subset of {', '.join(MODELS)} (\"\" or none: skip it)")
    p.add_argument("--bytes-models", default=",".join(BYTES_MODELS),
                   help=f"bytes section: comma-separated subset of {', '.join(BYTES_MODELS)} (\"\" or none: skip it)")
    p.add_argument("--new", type=int, default=128, help="tokens to generate")
    p.add_argument("--repeats", type=int, default=6, help="repeats of the 16-token pattern in the prompt")
    p.add_argument("--reps", type=int, default=3, help="interleaved rounds of the speed candidates")
    p.add_argument("--drafts", type=int_list, default=[3, 7], help="drafts per verify step (comma-separated, <= 7)")
    p.add_argument("--decode-max-step", type=int, default=128, help="KVCoreCache max_step of the speed runs")
    p.add_argument("--contexts", type=int_list, default=[4096, 16384], help="prefill lengths of the bytes section")
    p.add_argument("--max-step", type=int, default=512, help="prefill chunk of the bytes section")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    speed_models = names(args.models, MODELS, "--models")
    bytes_models = names(args.bytes_models, BYTES_MODELS, "--bytes-models")
    torch.set_num_threads(1)
    load_before = loadavg()
    t_start = time.perf_counter()
    max_positions = max([*args.contexts, 1024]) + 64
    ids = repetitive_prompt(args.repeats)
    results: dict[str, Any] = {}
    for name in speed_models:
        model = MODELS[name](max_positions)
        print(f"{name}: {describe(model)}", flush=True)
        results[name] = {"model": describe(model)}
        results[name]["speed"] = speed(model, ids, args.new, args.reps, args.drafts, args.decode_max_step)
    for name in bytes_models:
        model = BYTES_MODELS[name](max_positions)
        print(f"{name} (bytes): {describe(model)}", flush=True)
        results.setdefault(name, {"model": describe(model)})
        results[name]["memory"] = [memory(model, c, args.max_step) for c in args.contexts]
        if name in NOTES:
            results[name]["note"] = NOTES[name]
    ok = all(r["tokens_equal_greedy"] for m in results.values() for r in m.get("speed", {}).get("rows", []))
    meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "loadavg_before": load_before,
            "loadavg_after": loadavg(), "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "wall_s": round(time.perf_counter() - t_start, 1),
            "date": time.strftime("%Y-%m-%d"), "argv": list(sys.argv[1:] if argv is None else argv)}  # fmt: skip
    print(f"all tokens equal greedy: {ok}; load average {load_before} -> {meta['loadavg_after']}; "
          f"{meta['wall_s']} s", flush=True)  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"meta": meta, "models": results, "all_tokens_equal_greedy": ok}
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
