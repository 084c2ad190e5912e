"""``kvcore demo --runtime executorch --model NAME``: a real model run by ``kvcore-run``.

Gemma 3 270M (``kvcore.integrations.transformers_models``: from PyPI, converted once and cached) is exported
once with kvcore's off-graph attention (``kvcore.integrations.executorch_export``; about 1 to
2.5 minutes and 3.8 GB of memory) and the program cached beside the converted model; later
runs reuse it. ``kvcore-run`` (ExecuTorch's C++ runtime, kvcore's kernel behind the op, no
Python in that process) continues the real demo's passage (703 tokens, past the 512-token
window) greedily, then with ``--lookup N``; both must give transformers' own greedy
``generate()`` tokens (float32, one torch thread). Needs the gemma extra, torch, executorch
and the built ``kvcore-run``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import kvcore
from kvcore_demo import real
from kvcore.integrations import transformers_models as real_model
from kvcore_demo.executorch_runtime import BUILD_HINT, find_runner, run_runner, same_tokens, speeds
from kvcore_demo.runner import Progress, check_entry, format_checks

#: The cached program's sizes: positions it holds, tokens per forward.
CAPACITY, MAX_STEP = 2048, 64
#: The most tokens the demo generates (the passage and these fit CAPACITY).
MAX_GEN = 1024
_SOURCE = "kvcore-executorch-source.json"


@dataclasses.dataclass(frozen=True)
class ExecutorchRealOptions:
    """The knobs of ``kvcore demo --runtime executorch --model NAME``: the model, tokens to
    generate, prompt-lookup drafts per verify forward (0: no speculative run) and the
    ``kvcore-run`` binary (None: ``find_runner``)."""

    model: str = "gemma-3-270m"
    gen_len: int = 40
    lookup: int = 3
    runner: Optional[str] = None

    def check(self) -> None:
        """Raises ValueError naming the first option the run cannot honour, before anything is
        loaded: an unknown model, ``--gen-len`` outside [1, MAX_GEN], ``--lookup`` outside
        [0, MAX_STEP - 1], or no ``kvcore-run`` (the message says what to build)."""
        real_model.check_name(self.model)
        if not 1 <= self.gen_len <= MAX_GEN:
            raise ValueError(f"--gen-len = {self.gen_len}: must be in [1, {MAX_GEN}] (the passage and the tokens fit "
                             f"the program's {CAPACITY} positions)")  # fmt: skip
        if not 0 <= self.lookup <= MAX_STEP - 1:
            raise ValueError(f"--lookup = {self.lookup}: must be in [0, {MAX_STEP - 1}] (a verify forward of 1 + N "
                             f"tokens fits the program's max_step {MAX_STEP})")  # fmt: skip
        runner = find_runner(self.runner)
        if runner is None:
            raise ValueError(f"no kvcore-run found: {BUILD_HINT}")
        if not os.path.isfile(runner) or not os.access(runner, os.X_OK):
            raise ValueError(f"--runner {runner}: no such executable file; {BUILD_HINT}")


def cached_program(loaded: real_model.LoadedModel) -> tuple[Path, Optional[float]]:
    """The ``.pte`` of ``loaded`` (capacity CAPACITY, max_step MAX_STEP) in
    ``<cache_root>/<name>-executorch``, exported first when missing or made by another kvcore,
    executorch or transformers release or from another converted model; and the seconds that
    export took (None: cached). Written under a temporary name and renamed when complete.
    OSError when the cache directory cannot be written."""
    import transformers

    from kvcore.integrations.executorch_export import export_transformers

    directory = real_model.cache_root() / f"{loaded.name}-executorch"
    path = directory / f"kvcore-c{CAPACITY}-s{MAX_STEP}.pte"
    made_from = loaded.directory / "kvcore-source.json"  # the converted model's GGUF and transformers release
    converted = made_from.read_text() if made_from.exists() else ""
    source = {"model": loaded.name, "converted": converted, "kvcore": kvcore.__version__,
              "executorch": importlib.metadata.version("executorch"), "transformers": transformers.__version__,
              "capacity": CAPACITY, "max_step": MAX_STEP}  # fmt: skip
    record = directory / _SOURCE
    try:
        if path.exists() and json.loads(record.read_text()) == source:
            return path, None
    except (OSError, ValueError):
        pass
    directory.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    pte = export_transformers(loaded.model, capacity=CAPACITY, max_step=MAX_STEP)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pte)
    tmp.rename(path)
    record.write_text(json.dumps(source, indent=2) + "\n")
    return path, time.perf_counter() - start


def run_executorch_real_demo(opts: ExecutorchRealOptions, progress: Progress) -> dict[str, Any]:
    """Loads the model, exports it (or reuses the cached program), runs ``kvcore-run`` greedily
    and with ``--lookup``, and transformers' greedy ``generate()``; the report (``ok``, speeds in
    tokens/s, bytes, the continuation's text, the checks). ``opts.check()`` must have passed."""
    import warnings

    import torch
    from transformers.utils import logging

    runner = find_runner(opts.runner)
    assert runner is not None, "opts.check() finds the runner first"
    steps = 4 + (1 if opts.lookup else 0)
    progress.update("load", 0, steps)
    with real.torch_threads(1):
        loaded = real_model.load(opts.model)
        progress.update("export", 1, steps)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            path, export_seconds = cached_program(loaded)
        prompt = loaded.tokenizer(real.DEFAULT_PROMPT).input_ids
        runs: dict[str, Any] = {}
        errors: dict[str, str] = {}
        progress.update("kvcore-run", 2, steps)
        runs["greedy"], errors["greedy"] = run_runner(runner, path, prompt, opts.gen_len, 0, timeout=1800)
        if opts.lookup:
            progress.update("--lookup", 3, steps)
            runs["lookup"], errors["lookup"] = run_runner(runner, path, prompt, opts.gen_len, opts.lookup, timeout=1800)
        progress.update("transformers", steps - 1, steps)
        verbosity = logging.get_verbosity()
        logging.set_verbosity_error()  # its note on eos_token_id=-1 (generate every token asked for)
        start = time.perf_counter()
        try:
            with torch.no_grad():
                out = loaded.model.generate(torch.tensor([prompt]), max_new_tokens=opts.gen_len, do_sample=False,
                                            eos_token_id=-1, pad_token_id=0)  # fmt: skip
        finally:
            logging.set_verbosity(verbosity)
        transformers_seconds = time.perf_counter() - start
    progress.close()
    theirs = out[0, len(prompt) :].tolist()
    checks = []
    for name, label in (("greedy", "kvcore-run's greedy tokens equal transformers' generate()"),
                        ("lookup", f"kvcore-run --lookup {opts.lookup}'s tokens equal transformers' greedy ones")):
        if name in runs:
            ok, detail = same_tokens(theirs, runs[name]["tokens"] if runs[name] else None)
            checks.append(check_entry(label, ok, detail if runs[name] else errors[name]))
    return {
        "ok": all(c["ok"] for c in checks),
        "runtime": "executorch",
        "model": opts.model,
        "runner": runner,
        "program": str(path),
        "pte_bytes": path.stat().st_size,
        "export_seconds": None if export_seconds is None else round(export_seconds, 1),
        "capacity": CAPACITY,
        "max_step": MAX_STEP,
        "window": int(loaded.model.config.sliding_window),
        "prompt_tokens": len(prompt),
        "generated_tokens": opts.gen_len,
        "text": loaded.tokenizer.decode(theirs),
        "transformers_tokens": theirs,
        "transformers_seconds": round(transformers_seconds, 1),
        "greedy": runs.get("greedy"),
        "lookup": runs.get("lookup"),
        "lookup_n": opts.lookup,
        "checks": checks,
    }


def format_report(r: dict[str, Any]) -> str:
    """The report of ``run_executorch_real_demo`` as text."""
    made = "cached" if r["export_seconds"] is None else f"exported in {r['export_seconds']} s"
    lines = [
        f"kvcore demo --runtime executorch --model {r['model']}: {r['program']} ({r['pte_bytes']} bytes, {made}; "
        f"capacity {r['capacity']}, max_step {r['max_step']})",
        f"  run by {r['runner']} (ExecuTorch's C++ runtime, kvcore's kernel behind kvcache::update_and_attend)",
        f"  prompt {r['prompt_tokens']} tokens (past the {r['window']}-token window), {r['generated_tokens']} generated",
    ]
    if r["greedy"]:
        lines.append(f"  greedy: {speeds(r['greedy'])}; {r['greedy']['cache_bytes']} bytes of K/V")
    if r["lookup"]:
        g = r["lookup"]
        lines.append(f"  --lookup {r['lookup_n']}: {speeds(g)}; {g['forwards']} forwards, {g['accepted']} of "
                     f"{g['drafted']} drafted tokens accepted")  # fmt: skip
    lines.append(f"  transformers generate() (one torch thread): {r['transformers_seconds']} s")
    lines.append(f"  continuation: {r['text'][:160]!r}")
    return "\n".join([*lines, *format_checks(r)])


__all__ = ["CAPACITY", "MAX_GEN", "MAX_STEP", "ExecutorchRealOptions", "cached_program", "format_report",
           "run_executorch_real_demo"]  # fmt: skip
