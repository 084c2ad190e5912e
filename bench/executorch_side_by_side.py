"""Gemma 3 270M in ExecuTorch's runtime two ways: on kvcore's kernel, and on ExecuTorch's own cache path.

Issue 40 item 4. Both programs are exported from the same transformers model (float32) and
run by the same runtime, ExecuTorch 1.5.1's Python runtime (``executorch.runtime``, the
wheel's ``libexecutorch.so``), each in a process of its own:

- **kvcore**: ``kvcore export``'s program (``kvcore.integrations.executorch_export``: every
  attention layer calls ``kvcache::update_and_attend``), its kernel library
  ``libkvcore_executorch_ops.so`` loaded with ``RTLD_GLOBAL`` from ``$KVCORE_EXECUTORCH_OPS``
  and configured from the program's metadata; the cache lives outside the program.
- **ExecuTorch custom cache**: the path ExecuTorch's llama examples and optimum-executorch
  take for a hybrid (sliding + global) model: the K/V cache as mutable buffers in the program,
  ExecuTorch's ``CustomKVCache`` (global layers: ``capacity`` rows) and ``CustomRingKVCache``
  (sliding layers: ``2 * window`` rows and a position per row) written by
  ``llama::update_cache`` / ``llama::update_cache_with_indices``, attention by
  ``llama::custom_sdpa`` (causal from ``start_pos`` on global layers, the ring's mask on
  sliding ones); the AOT ops and their runtime kernels from the wheel's
  ``libcustom_ops_aot_lib.so`` (``executorch.extension.llm.custom_ops``). The attention
  function is optimum-executorch 1.1.0's ``custom_sdpa_ring_kv_cache`` recipe
  (``optimum/executorch/attentions/custom_sdpa.py``, ``custom_kv_cache.py``) re-stated here
  for transformers 5.24: optimum-executorch pins ``transformers==5.0.0rc1`` and imports
  ``transformers.cache_utils.HybridCache``, which 5.24 no longer has, so it is not installed;
  its caches hang off each attention module instead of a ``HybridCache`` subclass, the same
  ops in the same order.

- ``--systems hf-static`` (optional): transformers' own ExecuTorch recipe
  (``TorchExportableModuleForDecoderOnlyLM``: ``StaticCache`` of ``capacity`` rows in every layer,
  sliding layers windowed by the mask only; aten ``sdpa`` decomposed by ``to_edge``), the
  "reference cache" optimum-executorch falls back to without its custom ops.

Both programs: ``forward(tokens [1, T], positions)`` -> float32 logits of every position
``[1, T, vocab]`` (as ``kvcore export`` and transformers' ``TorchExportableModuleForDecoderOnlyLM``
both return), T dynamic in 1 .. 64, ``aten.linear`` kept whole (ExecuTorch's optimized kernel;
kvcore's export does this, so the ExecuTorch program gets it too), no delegate; the same
capacity (positions), so one program per system serves both prompt lengths.

Per prompt (1K and 8K tokens of this repository's docs at a pinned commit, Gemma's tokenizer,
BOS first): prefill in forwards of 64 tokens (tokens/s = prompt tokens / seconds of all prefill
forwards), then greedy decode, one token per forward (tokens/s over the ``--new - 1`` decode
forwards; the first new token comes from the prefill's last logits); KV bytes held (kvcore: its
kernel's arena, ``kvcore_et_nbytes``; ExecuTorch: the K/V mutable buffers of the exported
program, plus its ring position buffers reported apart); peak RSS (``VmHWM``) of the process
that loads and runs the program (torch and the runtime imported, the 1 GB program loaded);
the greedy tokens against transformers' own greedy ``generate()`` (float32, eager). One run of
each on a shared machine; the figures are not medians. ``--interleave R`` adds a speed-only
measurement less exposed to the machine's load drifting between processes: both programs in one
process, prefill chunks alternating, then R decode rounds in rotating order (median).

    export KVCORE_EXECUTORCH_OPS=BUILD/cpp/executorch/libkvcore_executorch_ops.so
    nice python bench/executorch_side_by_side.py --out bench/results/executorch_side_by_side.json
    # about 35 minutes on the shared 2-core machine (two exports of 1.5-3 min each, cached after)
    nice python bench/executorch_side_by_side.py --reference bench/results/executorch_side_by_side.json \
        --interleave 3 --skip-separate --out bench/results/executorch_side_by_side_interleaved.json
    python bench/executorch_side_by_side.py --table bench/results/executorch_side_by_side.json

``--forward-last ROUNDS`` measures prefill through every position's logits against the last
position's only, like for like in one process: kvcore's program exported with ``forward_last``
(``forward`` against ``forward_last`` on the same cache state, a rewind between), ExecuTorch's
program as above against a second export of it whose ``forward`` returns the last row only (as
ExecuTorch's llama export does by default); decode rounds as ``--interleave``:

    nice python bench/executorch_side_by_side.py --forward-last 3 --prompts 1024,8192 \
        --reference bench/results/executorch_side_by_side.json --out bench/results/executorch_side_by_side_forward_last.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

MODEL = "gemma-3-270m"
#: The prompt text: these docs at this commit, concatenated (a fixed text while the tree moves).
TEXT_COMMIT = "657f51f"
TEXT_FILES = ("docs/design.md", "docs/executorch.md", "docs/batch.md", "docs/pool.md", "docs/transformers.md",
              "docs/errors.md", "docs/trees.md", "docs/state.md")  # fmt: skip
ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("kvcore", "et-custom")


def _vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1


def _cpu_seconds() -> float:
    """CPU seconds of this process, all its threads (user + system)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def prompt_text() -> str:
    parts = [subprocess.run(["git", "show", f"{TEXT_COMMIT}:{name}"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout for name in TEXT_FILES]  # fmt: skip
    return "\n\n".join(parts)


# --- ExecuTorch's own cache path (optimum-executorch's custom_sdpa_ring_kv_cache recipe) -------------

ET_ATTENTION = "et_custom_sdpa_ring_kv_cache"


def _et_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, position_ids: Any = None,
                  scaling: Optional[float] = None, softcap: Any = None, head_mask: Any = None,
                  **kwargs: Any) -> tuple[Any, None]:  # fmt: skip
    """optimum-executorch's ``_custom_sdpa_for_ring_kv_cache`` with the cache update it relies on:
    q/k/v [B, H, T, D]; the layer's ExecuTorch cache (``module.et_kv_cache``) written with
    ``llama::update_cache`` (global) or ``update_cache_with_indices`` (ring), then
    ``llama::custom_sdpa`` over the cache ([B, S, H, D])."""
    import torch

    assert softcap is None and head_mask is None and position_ids is not None
    cache = module.et_kv_cache
    input_pos = position_ids[0]
    cache.update(input_pos=input_pos, k_val=key, v_val=value)  # ExecuTorch's own update (transposes to [B, S, H, D])
    q = query.transpose(1, 2).to(torch.float32)
    if getattr(cache, "is_ring_buffer", False):
        start_pos = input_pos[0].item()
        mask = cache.create_causal_mask_for_ring_buffer(start_pos, q.size(1))
        out = torch.ops.llama.custom_sdpa(q, cache.k_cache, cache.v_cache, start_pos=0, attn_mask=mask, drpout_p=0.0,
                                          is_causal=False, scale=scaling)  # fmt: skip
    else:
        start_pos = input_pos[0].item()
        out = torch.ops.llama.custom_sdpa(q, cache.k_cache, cache.v_cache, start_pos=start_pos, attn_mask=None,
                                          drpout_p=0.0, is_causal=True, scale=scaling)  # fmt: skip
    return out.to(query.dtype), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None  # custom_sdpa masks causally itself; the ring layers build their mask from the ring's positions


class ETCustomCacheLM:
    """Factory of the torch module exported for ExecuTorch's cache path (see the module doc)."""

    @staticmethod
    def build(model: Any, capacity: int, max_step: int, last: bool = False) -> Any:
        import torch
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama::custom_sdpa, update_cache)
        from executorch.examples.models.llama.source_transformation.custom_kv_cache import (
            CustomKVCache,
            CustomRingKVCache,
        )
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        ALL_ATTENTION_FUNCTIONS.register(ET_ATTENTION, _et_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(ET_ATTENTION, _no_mask)
        config = model.config
        config._attn_implementation = ET_ATTENTION
        n_kv, head_dim = int(config.num_key_value_heads), int(config.head_dim)
        for layer in model.model.layers:
            attn = layer.self_attn
            if attn.is_sliding:  # optimum: CustomRingKVCache(max_context_length = the layer's window)
                attn.et_kv_cache = CustomRingKVCache(1, int(config.sliding_window), n_kv, head_dim, dtype=torch.float32)
            else:
                attn.et_kv_cache = CustomKVCache(1, capacity, n_kv, head_dim, dtype=torch.float32)

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, tokens: Any, positions: Any) -> Any:
                # last: the head on the last row only ([1, 1, vocab]), as ExecuTorch's llama export
                # does by default (generate_full_logits=False)
                out = self.model(input_ids=tokens, position_ids=positions.reshape(1, -1), use_cache=False,
                                 logits_to_keep=1 if last else 0)  # fmt: skip
                return out.logits.float()

        wrapped = Wrapped().eval()
        T = torch.export.Dim("T", min=1, max=max_step)
        example = (torch.zeros(1, 2, dtype=torch.long), torch.arange(2, dtype=torch.long)[:, None])
        return wrapped, example, {"tokens": {1: T}, "positions": {0: T}}


def export_et_custom(capacity: int, max_step: int, out: Path, last: bool = False) -> dict[str, Any]:
    import torch
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    from kvcore.integrations import transformers_models

    model = transformers_models.load(MODEL).model.eval()
    wrapped, example, dynamic = ETCustomCacheLM.build(model, capacity, max_step, last)
    start = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(wrapped, example, dynamic_shapes=dynamic, strict=False)
    # the llama:: ops write their cache in place (not functionalized): every buffer, not only buffers_to_mutate
    names = sorted(set(ep.graph_signature.buffers))
    tensors = {**ep.constants, **ep.state_dict}
    kv = sum(tensors[n].nbytes for n in names if _is_kv(n))
    other = {n: tensors[n].nbytes for n in names if not _is_kv(n)}
    assert any("custom_sdpa" in str(node.target) for node in ep.graph.nodes), "custom_sdpa not in the graph"
    linear = [torch.ops.aten.linear.default]
    text = model.config
    edge = to_edge_transform_and_lower(
        ep, partitioner=[],
        compile_config=EdgeCompileConfig(_check_ir_validity=False, _core_aten_ops_exception_list=linear,
                                         preserve_ops=linear),
        constant_methods={"get_max_seq_len": capacity, "get_max_context_len": capacity, "use_kv_cache": True,
                          "enable_dynamic_shape": True, "get_vocab_size": int(text.vocab_size),
                          "sliding_window": int(text.sliding_window)},
    )  # fmt: skip
    pte = bytes(edge.to_executorch().buffer)
    out.write_bytes(pte)
    return {"export_seconds": round(time.perf_counter() - start, 1), "kv_bytes": kv,
            "buffers": len(names), "other_mutable_bytes": sum(other.values()), "pte_bytes": len(pte)}  # fmt: skip


def _is_kv(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]  # k_cache / v_cache (ExecuTorch's caches), key_cache_3 / value_cache_3 (transformers')
    return leaf in ("k_cache", "v_cache") or leaf.startswith(("key_cache_", "value_cache_"))


def export_hf_static(capacity: int, max_step: int, out: Path) -> dict[str, Any]:
    """transformers' own ExecuTorch recipe (``TorchExportableModuleForDecoderOnlyLM``: a hybrid
    model gets ``TorchExportableModuleWithHybridCache``, a ``StaticCache`` of ``capacity`` rows in
    every layer, its sliding layers swapped for full-length ``StaticLayer``s and windowed by the
    mask; attention ``sdpa``, decomposed by ``to_edge``), ``strict=True`` as that recipe exports
    (``strict=False`` fails in torch 2.13's AOT export), T dynamic in 1 .. max_step."""
    import torch
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    from kvcore.integrations import transformers_models

    model = transformers_models.load(MODEL).model.eval()
    start = time.perf_counter()
    mod = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=capacity)
    T = torch.export.Dim("T", min=1, max=max_step)
    with torch.no_grad():
        ep = mod.export(input_ids=torch.zeros(1, 2, dtype=torch.long), cache_position=torch.arange(2),
                        dynamic_shapes={"input_ids": {1: T}, "cache_position": {0: T}}, strict=True)  # fmt: skip
    names = sorted(set(ep.graph_signature.buffers))
    tensors = {**ep.constants, **ep.state_dict}
    kv = sum(tensors[n].nbytes for n in names if _is_kv(n))
    other = sum(tensors[n].nbytes for n in names if not _is_kv(n))
    linear = [torch.ops.aten.linear.default]
    edge = to_edge_transform_and_lower(
        ep, partitioner=[],
        compile_config=EdgeCompileConfig(_check_ir_validity=False, _core_aten_ops_exception_list=linear,
                                         preserve_ops=linear),
        constant_methods={"get_max_seq_len": capacity, "use_kv_cache": True, "enable_dynamic_shape": True,
                          "get_vocab_size": int(model.config.vocab_size)},
    )  # fmt: skip
    pte = bytes(edge.to_executorch().buffer)
    out.write_bytes(pte)
    return {"export_seconds": round(time.perf_counter() - start, 1), "kv_bytes": kv, "buffers": len(names),
            "other_mutable_bytes": other, "pte_bytes": len(pte)}  # fmt: skip


def export_kvcore(capacity: int, max_step: int, out: Path, forward_last: bool = False) -> dict[str, Any]:
    from kvcore.integrations import transformers_models
    from kvcore.integrations.executorch_export import export_transformers

    model = transformers_models.load(MODEL).model.eval()
    start = time.perf_counter()
    pte = export_transformers(model, capacity=capacity, max_step=max_step, forward_last=forward_last)
    out.write_bytes(pte)
    return {"export_seconds": round(time.perf_counter() - start, 1), "pte_bytes": len(pte)}


# --- running a program in executorch.runtime -------------------------------------------------------


def run_program(system: str, pte: Path, tokens: list[int], new: int, max_step: int) -> dict[str, Any]:
    """One prompt through one program, in this process (a fresh one per call)."""
    import torch

    if system == "kvcore":
        from kvcore.integrations.executorch_runtime import kvcore_metadata, load_kernel_library

        lib = load_kernel_library()
    else:
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (registers llama::* kernels)
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    rt = Runtime.get()
    program = rt.load_program(str(pte))
    method = program.load_method("forward")
    if system == "kvcore":
        meta = kvcore_metadata(program)
        lib.configure(meta)
    rss_loaded = _vm_hwm_kib()

    def forward(chunk: list[int], start: int) -> Any:
        t = torch.tensor([chunk], dtype=torch.long)
        p = torch.arange(start, start + len(chunk), dtype=torch.long)
        p = p if system == "hf-static" else p[:, None]  # transformers' recipe: cache_position [T]
        return method.execute([t, p])[0]

    t0, c0 = time.perf_counter(), _cpu_seconds()
    for s in range(0, len(tokens), max_step):
        logits = forward(tokens[s : s + max_step], s)
    prefill, prefill_cpu = time.perf_counter() - t0, _cpu_seconds() - c0
    out = [int(logits[0, -1].argmax())]
    t0, c0 = time.perf_counter(), _cpu_seconds()
    for i in range(new - 1):
        logits = forward([out[-1]], len(tokens) + i)
        out.append(int(logits[0, -1].argmax()))
    decode, decode_cpu = time.perf_counter() - t0, _cpu_seconds() - c0
    result = {
        "prompt_tokens": len(tokens), "new_tokens": new, "prefill_seconds": round(prefill, 3),
        "prefill_tokens_per_s": round(len(tokens) / prefill, 1), "decode_seconds": round(decode, 3),
        "decode_tokens_per_s": round((new - 1) / decode, 2), "tokens": out,
        "prefill_cpu_seconds": round(prefill_cpu, 3), "decode_cpu_ms_per_token": round(1000 * decode_cpu / (new - 1), 1),
        "peak_rss_kib": _vm_hwm_kib(), "peak_rss_after_load_kib": rss_loaded,
        "threadpool_threads": int(portable_lib._threadpool_get_thread_count()),
    }  # fmt: skip
    if system == "kvcore":
        result["kv_bytes"] = lib.nbytes
        result["kvcore_length"] = lib.length
        result["kvcore_layers"] = meta.describe()
        result["kvcore_threads"] = lib.threads
    return result


def run_interleaved(systems: list[str], ptes: dict[str, str], tokens: list[int], new: int, max_step: int,
                    rounds: int, kvcore_threads: int = 0, kvcore_single: bool = False) -> dict[str, Any]:
    """Speed only, like for like in time: every program loaded in this one process (the kernels of
    both registered in the one runtime), the prompt prefilled chunk by chunk alternating the
    programs (the order flipped each chunk), then ``rounds`` rounds of decoding ``new - 1``
    tokens from the prompt's end, the programs' order rotating each round (kvcore rewinds its
    cache to the prompt; ExecuTorch's cache is overwritten at the same positions, and its causal
    and ring masks see none of the stale rows). Figures: prefill over all chunks, decode the
    median round; each round's tokens must equal the first's. kvcore attends on
    ``kvcore_threads`` workers (0: one per processor online); with ``kvcore_single`` each round
    also decodes with kvcore on one thread (``kvcore-1thread``: the same program and cache,
    ``set_threads(1)``; decode only, the prefill was threaded)."""
    import statistics

    import torch

    if "kvcore" in systems:
        from kvcore.integrations.executorch_runtime import kvcore_metadata, load_kernel_library

        lib = load_kernel_library()
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    rt = Runtime.get()
    methods, programs = {}, {}
    for system in systems:
        programs[system] = rt.load_program(ptes[system])
        methods[system] = programs[system].load_method("forward")
    if "kvcore" in systems:
        lib.set_threads(kvcore_threads)
        lib.configure(kvcore_metadata(programs["kvcore"]))
    decoders = systems + (["kvcore-1thread"] if kvcore_single and "kvcore" in systems else [])

    def forward(system: str, chunk: list[int], start: int) -> Any:
        t = torch.tensor([chunk], dtype=torch.long)
        p = torch.arange(start, start + len(chunk), dtype=torch.long)
        return methods[system].execute([t, p if system == "hf-static" else p[:, None]])[0]

    res: dict[str, Any] = {x: {"prefill_seconds": 0.0, "decode_rounds_seconds": [], "decode_rounds_cpu_seconds": []}
                           for x in decoders}  # fmt: skip
    if "kvcore" in systems:
        res["kvcore"]["threads"] = lib.threads
    last: dict[str, Any] = {}
    for i, s in enumerate(range(0, len(tokens), max_step)):
        for system in systems if i % 2 == 0 else systems[::-1]:
            t0 = time.perf_counter()
            last[system] = forward(system, tokens[s : s + max_step], s)
            res[system]["prefill_seconds"] += time.perf_counter() - t0
    first = {x: int(last[x][0, -1].argmax()) for x in systems}
    for r in range(rounds):
        order = decoders[r % len(decoders) :] + decoders[: r % len(decoders)]
        for system in order:
            program = "kvcore" if system.startswith("kvcore") else system
            if program == "kvcore":
                lib.set_threads(1 if system == "kvcore-1thread" else kvcore_threads)
                lib.rewind(len(tokens))
            out = [first[program]]
            t0, c0 = time.perf_counter(), _cpu_seconds()
            for i in range(new - 1):
                logits = forward(program, [out[-1]], len(tokens) + i)
                out.append(int(logits[0, -1].argmax()))
            res[system]["decode_rounds_seconds"].append(round(time.perf_counter() - t0, 3))
            res[system]["decode_rounds_cpu_seconds"].append(round(_cpu_seconds() - c0, 3))
            if "tokens" not in res[system]:
                res[system]["tokens"] = out
            res[system]["rounds_agree"] = res[system].get("rounds_agree", True) and out == res[system]["tokens"]
    if "kvcore-1thread" in res:
        res["kvcore-1thread"].update(threads=1, prefill_seconds=res["kvcore"]["prefill_seconds"], prefill_note="kvcore's")
    for system, x in res.items():
        x["prefill_tokens_per_s"] = round(len(tokens) / x["prefill_seconds"], 1)
        x["prefill_seconds"] = round(x["prefill_seconds"], 3)
        x["decode_tokens_per_s"] = round((new - 1) / statistics.median(x["decode_rounds_seconds"]), 2)
        x["decode_cpu_ms_per_token"] = round(1000 * statistics.median(x["decode_rounds_cpu_seconds"]) / (new - 1), 1)
    return res


def run_forward_last(ptes: dict[str, str], tokens: list[int], new: int, max_step: int, rounds: int) -> dict[str, Any]:
    """Prefill through every position's logits against the last position's only, both systems,
    speed in one process (``--forward-last``). ``ptes``: ``kvcore`` (a program with ``forward``
    and ``forward_last``, one kvcore cache), ``et-custom`` (ExecuTorch's path, ``forward`` returns
    every position's logits) and ``et-custom-last`` (the same export but ``forward`` returns the
    last position's only: two programs, two caches). Per 64-token chunk, in an order flipped each
    chunk: kvcore's ``forward``, a rewind of its cache to the chunk's start, kvcore's
    ``forward_last`` (so both see the same cache state; the rewind's time is not counted), and
    each ExecuTorch program's forward. Then ``rounds`` decode rounds as ``run_interleaved``:
    ``kvcore`` decodes through ``forward``, ``kvcore-last`` through ``forward_last`` (one token:
    the same work), each ExecuTorch program through its ``forward``. Also the largest |diff|
    between kvcore's ``forward`` last row and ``forward_last`` over every chunk."""
    import statistics

    import torch

    from kvcore.integrations.executorch_runtime import kvcore_metadata, load_kernel_library

    lib = load_kernel_library()
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    from executorch.runtime import Runtime

    rt = Runtime.get()
    programs = {x: rt.load_program(ptes[x]) for x in ("kvcore", "et-custom", "et-custom-last")}
    meta = kvcore_metadata(programs["kvcore"])
    assert meta.forward_last == 1, "the kvcore program has no forward_last"
    methods = {"kvcore": programs["kvcore"].load_method("forward"),
               "kvcore-last": programs["kvcore"].load_method("forward_last"),
               "et-custom": programs["et-custom"].load_method("forward"),
               "et-custom-last": programs["et-custom-last"].load_method("forward")}  # fmt: skip
    lib.configure(meta)
    names = list(methods)

    def forward(name: str, chunk: list[int], start: int) -> Any:
        t = torch.tensor([chunk], dtype=torch.long)
        return methods[name].execute([t, torch.arange(start, start + len(chunk), dtype=torch.long)[:, None]])[0]

    res: dict[str, Any] = {x: {"prefill_seconds": 0.0, "decode_rounds_seconds": [], "decode_rounds_cpu_seconds": []}
                           for x in names}  # fmt: skip
    last: dict[str, Any] = {}
    max_diff = 0.0
    for i, s in enumerate(range(0, len(tokens), max_step)):
        chunk = tokens[s : s + max_step]
        order = names if i % 2 == 0 else names[::-1]
        kv_order = [x for x in order if x.startswith("kvcore")]
        for name in order:
            if name == kv_order[1]:
                lib.rewind(s)  # the second kvcore method sees the cache the first saw
            t0 = time.perf_counter()
            last[name] = forward(name, chunk, s)
            res[name]["prefill_seconds"] += time.perf_counter() - t0
        assert tuple(last["kvcore-last"].shape) == (1, 1, last["kvcore"].shape[2]), last["kvcore-last"].shape
        assert tuple(last["et-custom-last"].shape) == (1, 1, last["et-custom"].shape[2])
        max_diff = max(max_diff, float((last["kvcore"][0, -1] - last["kvcore-last"][0, -1]).abs().max()))
    first = {x: int(last[x][0, -1].argmax()) for x in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name.startswith("kvcore"):
                lib.rewind(len(tokens))
            out = [first[name]]
            t0, c0 = time.perf_counter(), _cpu_seconds()
            for i in range(new - 1):
                logits = forward(name, [out[-1]], len(tokens) + i)
                out.append(int(logits[0, -1].argmax()))
            res[name]["decode_rounds_seconds"].append(round(time.perf_counter() - t0, 3))
            res[name]["decode_rounds_cpu_seconds"].append(round(_cpu_seconds() - c0, 3))
            res[name].setdefault("tokens", out)
            res[name]["rounds_agree"] = res[name].get("rounds_agree", True) and out == res[name]["tokens"]
    for name, x in res.items():
        x["prefill_method"] = {"kvcore": "forward", "kvcore-last": "forward_last"}.get(name, "forward")
        x["prefill_tokens_per_s"] = round(len(tokens) / x["prefill_seconds"], 1)
        x["prefill_seconds"] = round(x["prefill_seconds"], 3)
        x["decode_tokens_per_s"] = round((new - 1) / statistics.median(x["decode_rounds_seconds"]), 2)
        x["decode_cpu_ms_per_token"] = round(1000 * statistics.median(x["decode_rounds_cpu_seconds"]) / (new - 1), 1)
    return {"systems": res, "kvcore_forward_vs_forward_last_max_abs_diff": max_diff,
            "load_average_end": os.getloadavg()}  # fmt: skip


def transformers_tokens(prompts: dict[str, list[int]], new: int) -> dict[str, Any]:
    import torch
    from transformers.utils import logging

    from kvcore.integrations import transformers_models

    model = transformers_models.load(MODEL).model.eval()
    logging.set_verbosity_error()
    out: dict[str, Any] = {"attn_implementation": model.config._attn_implementation, "torch_threads": torch.get_num_threads()}
    for name, ids in prompts.items():
        start = time.perf_counter()
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=-1,
                                 pad_token_id=0)  # fmt: skip
        out[name] = {"tokens": gen[0, len(ids) :].tolist(), "seconds": round(time.perf_counter() - start, 1)}
    return out


def config_kv_bytes(system: str, capacity: int, max_step: int) -> int:
    """K/V bytes each program's cache holds by its layout, from the model's config.json (float32):
    kvcore: flat layers ``capacity`` rows, ring layers ``window + max_step - 1``; ExecuTorch's
    custom cache: ``capacity`` rows, ring layers ``2 * window`` (``CustomRingKVCache``);
    transformers' recipe: ``capacity`` rows in every layer."""
    from kvcore.integrations import transformers_models

    cfg = json.loads((transformers_models.cache_root() / MODEL / "config.json").read_text())
    row = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
    window = cfg["sliding_window"]
    ring = {"kvcore": window + max_step - 1, "et-custom": 2 * window, "hf-static": capacity}[system]
    return sum(row * (ring if t == "sliding_attention" else capacity) for t in cfg["layer_types"])


def fill_kv(report: dict[str, Any]) -> None:
    """Each run's ``kv_bytes_config`` (its layout from config.json); an ExecuTorch program's
    ``kv_bytes`` from its exported buffers, from the layout when the export did not count them."""
    for runs in report["runs"].values():
        for system, x in runs.items():
            x["kv_bytes_config"] = config_kv_bytes(system, report["capacity"], report["max_step"])
            if not x.get("kv_bytes"):
                x["kv_bytes"] = x["kv_bytes_config"]
                x["kv_bytes_source"] = "config.json layout (the export counted no buffers)"


# --- the driver ----------------------------------------------------------------------------------------


def child(argv: list[str]) -> int:
    job = json.loads(argv[0])
    kind = job["kind"]
    if kind == "export":
        fn = {"kvcore": export_kvcore, "et-custom": export_et_custom, "hf-static": export_hf_static}[job["system"]]
        extra = {"kvcore": {"forward_last": True}, "et-custom": {"last": True}} if job.get("last") else {}
        res = fn(job["capacity"], job["max_step"], Path(job["out"]), **extra.get(job["system"], {}))
    elif kind == "run":
        res = run_program(job["system"], Path(job["pte"]), job["tokens"], job["new"], job["max_step"])
    elif kind == "forward_last":
        res = run_forward_last(job["ptes"], job["tokens"], job["new"], job["max_step"], job["rounds"])
    elif kind == "interleave":
        res = run_interleaved(job["systems"], job["ptes"], job["tokens"], job["new"], job["max_step"], job["rounds"],
                              job.get("kvcore_threads", 0), job.get("kvcore_single", False))
    else:
        res = transformers_tokens(job["prompts"], job["new"])
    res["peak_rss_kib_process"] = _vm_hwm_kib()
    print("RESULT " + json.dumps(res))
    return 0


def spawn(job: dict[str, Any], log: Any) -> dict[str, Any]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{job['kind']} {job.get('system', '')} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    res: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    print(f"  {job['kind']} {job.get('system', '')} {job.get('label', '')}: {time.perf_counter() - start:.0f} s",
          file=log, flush=True)  # fmt: skip
    return res


def first_mismatch(a: list[int], b: list[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    if len(sys.argv) > 2 and sys.argv[1] == "--table":  # --table RESULT.json [--rewrite]: its table (kv filled in)
        report = json.loads(Path(sys.argv[2]).read_text())
        fill_kv(report)
        if "--rewrite" in sys.argv[3:]:
            Path(sys.argv[2]).write_text(json.dumps(report, indent=1) + "\n")
        print(table(report))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default="1024,8192", help="prompt lengths in tokens")
    ap.add_argument("--new", type=int, default=32, help="tokens generated per prompt (the first from the prefill)")
    ap.add_argument("--capacity", type=int, default=8320, help="positions both programs hold (>= prompt + new)")
    ap.add_argument("--max-step", type=int, default=64, help="tokens per forward (both programs)")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache/kvcore/side-by-side"), help="the exported programs")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--no-transformers", action="store_true", help="skip transformers' generate() (no token check)")
    ap.add_argument("--reference", default=None,
                    help="take transformers' tokens from this earlier result JSON (same prompts and --new) instead of running generate()")
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                    help="also time the programs in one process, interleaved, decode ROUNDS times (median)")
    ap.add_argument("--skip-separate", action="store_true", help="no process per program (no peak RSS): --interleave only")
    ap.add_argument("--kvcore-threads", type=int, default=0,
                    help="kvcore's attention workers (0: one per processor online; 1: the runtime's thread alone)")
    ap.add_argument("--kvcore-single-too", action="store_true",
                    help="--interleave: each round also decodes with kvcore on one thread (kvcore-1thread)")
    ap.add_argument("--forward-last", type=int, default=0, metavar="ROUNDS",
                    help="only: prefill through every position's logits against the last position's, both systems "
                         "interleaved in one process (kvcore: forward against forward_last of one program; "
                         "ExecuTorch: a second export whose forward returns the last row), decode ROUNDS times")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if args.forward_last:
        return main_forward_last(args)
    lengths = [int(x) for x in args.prompts.split(",")]
    systems = args.systems.split(",")
    if max(lengths) + args.new > args.capacity:
        ap.error(f"--capacity {args.capacity} < longest prompt + --new")
    from transformers import AutoTokenizer

    from kvcore.integrations import transformers_models

    tok = AutoTokenizer.from_pretrained(str(transformers_models.cache_root() / MODEL))
    ids = tok(prompt_text()).input_ids
    if len(ids) < max(lengths):
        ap.error(f"the prompt text has {len(ids)} tokens, fewer than {max(lengths)}")
    prompts = {str(n): ids[:n] for n in lengths}
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    log = sys.stderr
    report: dict[str, Any] = {
        "model": MODEL, "new_tokens": args.new, "capacity": args.capacity, "max_step": args.max_step,
        "prompt_text": f"{', '.join(TEXT_FILES)} at {TEXT_COMMIT}", "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "load_average_start": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "exports": {}, "runs": {},
    }  # fmt: skip
    ptes = {}
    for system in systems:
        pte = cache / f"{system}-c{args.capacity}-s{args.max_step}.pte"
        side = pte.with_suffix(".json")
        if not (pte.exists() and side.exists()):
            res = spawn({"kind": "export", "system": system, "capacity": args.capacity, "max_step": args.max_step,
                         "out": str(pte)}, log)  # fmt: skip
            side.write_text(json.dumps(res, indent=2) + "\n")
        report["exports"][system] = {"pte": str(pte), **json.loads(side.read_text())}
        ptes[system] = pte
    if args.reference:
        earlier = json.loads(Path(args.reference).read_text())
        if earlier["new_tokens"] != args.new or earlier["prompt_text"] != report["prompt_text"]:
            ap.error(f"--reference {args.reference}: made with other prompts or --new")
        report["transformers"] = {**earlier["transformers"], "from": args.reference}
    elif not args.no_transformers:
        report["transformers"] = spawn({"kind": "transformers", "prompts": prompts, "new": args.new}, log)
    for name, toks in prompts.items():
        if args.interleave:
            inter = spawn({"kind": "interleave", "systems": systems, "ptes": {x: str(ptes[x]) for x in systems},
                           "tokens": toks, "new": args.new, "max_step": args.max_step, "rounds": args.interleave,
                           "kvcore_threads": args.kvcore_threads, "kvcore_single": args.kvcore_single_too,
                           "label": name}, log)  # fmt: skip
            for system in [x for x in inter if x != "peak_rss_kib_process"]:
                x = inter[system]
                if "transformers" in report:
                    mm = first_mismatch(x["tokens"], report["transformers"][name]["tokens"])
                    x["equals_transformers"], x["first_mismatch"] = mm is None, mm
                print(f"    interleaved {system} {name}: prefill {x['prefill_tokens_per_s']} tok/s, decode "
                      f"{x['decode_tokens_per_s']} tok/s (rounds {x['decode_rounds_seconds']} s), "
                      f"equal: {x.get('equals_transformers')}", file=log, flush=True)  # fmt: skip
            inter["peak_rss_kib_process"] = inter.pop("peak_rss_kib_process", None)
            report.setdefault("interleaved", {})[name] = inter
        if args.out:  # what is done so far, in case the run is cut short
            Path(args.out).write_text(json.dumps({**report, "partial": True}, indent=1) + "\n")
        if args.skip_separate:
            continue
        for system in systems:
            res = spawn({"kind": "run", "system": system, "pte": str(ptes[system]), "tokens": toks, "new": args.new,
                         "max_step": args.max_step, "label": name}, log)  # fmt: skip
            if system in ("et-custom", "hf-static"):
                res["kv_bytes"] = report["exports"][system]["kv_bytes"]
                res["other_mutable_bytes"] = report["exports"][system]["other_mutable_bytes"]
            if "transformers" in report:
                ref = report["transformers"][name]["tokens"]
                mm = first_mismatch(res["tokens"], ref)
                res["equals_transformers"] = mm is None
                res["first_mismatch"] = mm
            report["runs"].setdefault(name, {})[system] = res
            print(f"    {system} {name}: prefill {res['prefill_tokens_per_s']} tok/s, decode {res['decode_tokens_per_s']} "
                  f"tok/s, KV {res['kv_bytes'] / 2**20:.1f} MiB, peak RSS {res['peak_rss_kib'] / 1024:.0f} MiB, "
                  f"equal: {res.get('equals_transformers')}", file=log, flush=True)  # fmt: skip
    report["load_average_end"] = os.getloadavg()
    fill_kv(report)
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(table(report))
    return 0


def main_forward_last(args: Any) -> int:
    """``--forward-last ROUNDS``: the exports (kvcore's with ``forward_last``; ExecuTorch's whose
    forward returns every position's logits, and its last-row twin), cached; then per prompt
    ``run_forward_last`` in a process of its own; tokens checked against ``--reference``'s
    transformers tokens where it has the prompt, and between the four."""
    from transformers import AutoTokenizer

    from kvcore.integrations import transformers_models

    lengths = [int(x) for x in args.prompts.split(",")]
    tok = AutoTokenizer.from_pretrained(str(transformers_models.cache_root() / MODEL))
    ids = tok(prompt_text()).input_ids
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    log = sys.stderr
    report: dict[str, Any] = {
        "model": MODEL, "new_tokens": args.new, "capacity": args.capacity, "max_step": args.max_step,
        "prompt_text": f"{', '.join(TEXT_FILES)} at {TEXT_COMMIT}", "cpus": os.cpu_count(),
        "load_average_start": os.getloadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "exports": {}, "forward_last": {},
    }  # fmt: skip
    ptes = {}
    for name, system, last in (("kvcore", "kvcore", True), ("et-custom", "et-custom", False),
                               ("et-custom-last", "et-custom", True)):  # fmt: skip
        stem = {"kvcore": "kvcore-fl", "et-custom": "et-custom", "et-custom-last": "et-custom-last"}[name]
        pte = cache / f"{stem}-c{args.capacity}-s{args.max_step}.pte"
        side = pte.with_suffix(".json")
        if not (pte.exists() and side.exists()):
            res = spawn({"kind": "export", "system": system, "capacity": args.capacity, "max_step": args.max_step,
                         "out": str(pte), "last": last, "label": name}, log)  # fmt: skip
            side.write_text(json.dumps(res, indent=2) + "\n")
        report["exports"][name] = {"pte": str(pte), **json.loads(side.read_text())}
        ptes[name] = str(pte)
    reference = json.loads(Path(args.reference).read_text())["transformers"] if args.reference else {}
    for n in lengths:
        res = spawn({"kind": "forward_last", "ptes": ptes, "tokens": ids[:n], "new": args.new,
                     "max_step": args.max_step, "rounds": args.forward_last, "label": str(n)}, log)  # fmt: skip
        systems = res["systems"]
        ref = reference.get(str(n), {}).get("tokens")
        for name, x in systems.items():
            x["equals_kvcore_forward"] = x["tokens"] == systems["kvcore"]["tokens"]
            x["equals_transformers"] = None if ref is None else x["tokens"] == ref
            print(f"    {name} {n}: prefill {x['prefill_tokens_per_s']} tok/s, decode {x['decode_tokens_per_s']} tok/s,"
                  f" tokens = kvcore forward's: {x['equals_kvcore_forward']}, = transformers': "
                  f"{x['equals_transformers']}", file=log, flush=True)  # fmt: skip
        report["forward_last"][str(n)] = res
        if args.out:
            Path(args.out).write_text(json.dumps({**report, "partial": True}, indent=1) + "\n")
    report["load_average_end"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def table(r: dict[str, Any]) -> str:
    names = {"kvcore": "kvcore kernel (`kvcache::update_and_attend`)",
             "et-custom": "ExecuTorch `custom_sdpa` + custom ring/static KV cache",
             "hf-static": "transformers' recipe: `StaticCache`, aten `sdpa`",
             "kvcore-1thread": "kvcore kernel on 1 thread (decode; its prefill is kvcore's)"}
    rows = ["| prompt | program | prefill tok/s | decode tok/s | KV bytes held | peak RSS | tokens = transformers |",
            "|---:|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for name, runs in r["runs"].items():
        for system, x in runs.items():
            eq = x.get("equals_transformers")
            eq_s = "n/a" if eq is None else ("yes" if eq else f"no (from token {x['first_mismatch']})")
            rows.append(f"| {name} | {names.get(system, system)} | {x['prefill_tokens_per_s']:.0f} | "
                        f"{x['decode_tokens_per_s']:.1f} | {x['kv_bytes'] / 2**20:.1f} MiB | "
                        f"{x['peak_rss_kib'] / 1024:.0f} MiB | {eq_s} |")  # fmt: skip
    if r.get("interleaved"):
        rows += ["", "Interleaved in one process (speed only):", "",
                 "| prompt | program | prefill tok/s | decode tok/s (median round) | decode CPU ms/token | tokens = transformers |",
                 "|---:|---|---:|---:|---:|---|"]  # fmt: skip
        for name, runs in r["interleaved"].items():
            for system, x in runs.items():
                if not isinstance(x, dict):
                    continue
                eq = x.get("equals_transformers")
                eq_s = "n/a" if eq is None else ("yes" if eq else f"no (from token {x['first_mismatch']})")
                rows.append(f"| {name} | {names.get(system, system)} | {x['prefill_tokens_per_s']:.0f} | "
                            f"{x['decode_tokens_per_s']:.2f} | {x['decode_cpu_ms_per_token']:.0f} | {eq_s} |")  # fmt: skip
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
