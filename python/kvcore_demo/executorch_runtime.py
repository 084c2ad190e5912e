"""``kvcore demo --runtime executorch``: a tiny random model run by ExecuTorch's C++ runtime on kvcore.

A tiny random decoder (``kvcore.integrations.executorch_tiny``: flat, ring(window, sinks),
flat; attention through ``kvcache::update_and_attend``) is exported to a ``.pte`` in a few
seconds, then run by ``kvcore-run`` (``cpp/executorch/kvcore_run.cpp``: ExecuTorch's C++
runtime with kvcore's kernel library behind the op, no Python in that process): the prompt
(a random phrase, repeated) is prefilled in ``max_step`` chunks and the rest decoded greedily, past the ring's wrap;
with ``--lookup N`` a second run decodes with exact prompt-lookup speculative decoding
(kvcore's rewinds drop rejected drafts). The same model then decodes greedily in plain
PyTorch (the whole sequence each token, explicit masks, no cache): every token of both runs
must equal PyTorch's.

Needs torch and executorch (``pip install torch && pip install --no-deps executorch==1.5.1
&& pip install ruamel.yaml flatbuffers tabulate``) and the built ``kvcore-run`` (kvcore's
CMake builds it beside ``libkvcore_executorch_ops.so`` when the executorch wheel is
installed): found from ``--runner``, else ``$KVCORE_RUN``, else beside
``$KVCORE_EXECUTORCH_OPS``, else on ``PATH``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional

from kvcore_demo.runner import Progress, check_entry, format_checks

#: The environment variable naming a ``kvcore-run`` binary.
RUNNER_ENV = "KVCORE_RUN"
#: The environment variable naming the kernel library; ``kvcore-run`` is built beside it.
KERNEL_LIBRARY_ENV = "KVCORE_EXECUTORCH_OPS"
#: How to build the runner, for the refusal when none is found.
BUILD_HINT = (
    "build it with kvcore's CMake and the executorch wheel installed (cmake -S . -B build/et -G Ninja && "
    "cmake --build build/et --target kvcore-run), then pass --runner build/et/cpp/executorch/kvcore-run or set "
    f"${KERNEL_LIBRARY_ENV} to build/et/cpp/executorch/libkvcore_executorch_ops.so"
)
INSTALL_HINT = (
    "pip install torch && pip install --no-deps executorch==1.5.1 && pip install ruamel.yaml flatbuffers tabulate"
)
#: The longest run the demo accepts (positions): the PyTorch check recomputes the whole sequence per token.
MAX_CAPACITY = 1024
#: The prompt is a random phrase of this many tokens, repeated to ``--prompt-len``.
PHRASE = 4
#: Seconds one kvcore-run call may take before the demo gives up on it.
RUNNER_TIMEOUT = 120.0


def find_runner(given: Optional[str] = None) -> Optional[str]:
    """The ``kvcore-run`` binary to use: ``given`` when not None (returned as is, checked by the
    caller), else ``$KVCORE_RUN``, else ``kvcore-run`` beside ``$KVCORE_EXECUTORCH_OPS``, else
    ``kvcore-run`` on ``PATH``; None when none of these names an existing file."""
    if given is not None:
        return given
    candidates = [os.environ.get(RUNNER_ENV, "")]
    library = os.environ.get(KERNEL_LIBRARY_ENV)
    if library:
        candidates.append(str(Path(library).parent / "kvcore-run"))
    candidates.append(shutil.which("kvcore-run") or "")
    return next((c for c in candidates if c and os.path.isfile(c)), None)


@dataclasses.dataclass(frozen=True)
class ExecutorchDemoOptions:
    """The knobs of ``kvcore demo --runtime executorch`` (see its ``--help``): prompt and
    generated tokens, prompt-lookup drafts per forward (0: no speculative run), the ring
    layer's window and sinks (positions), the largest forward (tokens; prefill chunks), the
    weights and prompt seed, and the ``kvcore-run`` binary (None: ``find_runner``)."""

    prompt_len: int = 24
    gen_len: int = 40
    lookup: int = 3
    window: int = 8
    sinks: int = 0
    max_step: int = 8
    seed: int = 0
    runner: Optional[str] = None

    @property
    def capacity(self) -> int:
        """The program's capacity (positions): the prompt and the generated tokens."""
        return self.prompt_len + self.gen_len

    def check(self) -> None:
        """Raises ValueError naming the first option the run cannot honour, before anything is
        imported or exported: a value below its least,
        ``--lookup`` not below ``--max-step``, a run longer than ``MAX_CAPACITY``, torch or
        executorch missing, or no ``kvcore-run`` to run (the message says what to build)."""
        at_least = {"prompt_len": 1, "gen_len": 1, "window": 1, "sinks": 0, "max_step": 1, "lookup": 0, "seed": 0}
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ValueError(f"--{name.replace('_', '-')} = {getattr(self, name)}: must be >= {low}")
        if self.max_step > self.capacity:
            raise ValueError(f"--max-step = {self.max_step}: must be <= {self.capacity}, the longest sequence of "
                             "this run (--prompt-len + --gen-len)")
        if self.lookup > self.max_step - 1:
            raise ValueError(f"--lookup = {self.lookup}: must be <= --max-step - 1 = {self.max_step - 1} (a verify "
                             "forward carries the last token and its drafts)")
        if self.capacity > MAX_CAPACITY:
            raise ValueError(f"--prompt-len + --gen-len = {self.capacity}: must be <= {MAX_CAPACITY} (the PyTorch "
                             "check recomputes the whole sequence for each token)")
        for module in ("torch", "executorch"):
            if importlib.util.find_spec(module) is None:
                raise ValueError(f"needs the {module!r} package: {INSTALL_HINT}")
        runner = find_runner(self.runner)
        if runner is None:
            raise ValueError(f"no kvcore-run found (--runner, ${RUNNER_ENV}, beside ${KERNEL_LIBRARY_ENV}, PATH): "
                             f"{BUILD_HINT}")
        if not os.path.isfile(runner) or not os.access(runner, os.X_OK):
            raise ValueError(f"--runner {runner}: no such executable file; {BUILD_HINT}")

    def tiny_config(self) -> Any:
        """The ``executorch_tiny.TinyConfig`` of the demo's model (imports torch and executorch)."""
        from kvcore.integrations.executorch_runtime import FLAT, RING
        from kvcore.integrations.executorch_tiny import TinyConfig

        return TinyConfig(kinds=(FLAT, RING, FLAT), windows=(0, self.window, 0), sinks=(0, self.sinks, 0),
                          capacity=self.capacity, max_step=self.max_step, seed=self.seed)  # fmt: skip


_SPEEDS = re.compile(
    r"(\d+) tokens in ([\d.]+) ms \((\d+) tokens/s\); decode: (\d+) tokens in ([\d.]+) ms \((\d+) tokens/s\)"
)
_LOOKUP = re.compile(r"(\d+) forwards for (\d+) tokens, (\d+) of (\d+) drafted tokens accepted")


def parse_runner_output(stdout: str) -> dict[str, Any]:
    """What ``kvcore-run`` printed: ``tokens`` (ids), prefill and decode tokens and milliseconds,
    the cache's K/V bytes, and with ``--lookup`` its forwards, drafted and accepted tokens.
    ValueError naming the line when the output is not kvcore-run's."""
    lines = dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)
    out: dict[str, Any] = {}
    try:
        out["tokens"] = [int(t) for t in lines["tokens"].split()]
        speeds = _SPEEDS.fullmatch(lines["prefill"])
        if speeds is None:
            raise ValueError(f"prefill: {lines['prefill']!r}")
        out.update(prefill_tokens=int(speeds[1]), prefill_ms=float(speeds[2]), decode_tokens=int(speeds[4]),
                   decode_ms=float(speeds[5]))  # fmt: skip
        out["cache_bytes"] = int(lines["cache"].rsplit(", ", 1)[1].split()[0])
        if "lookup" in lines:
            lookup = _LOOKUP.fullmatch(lines["lookup"])
            if lookup is None:
                raise ValueError(f"lookup: {lines['lookup']!r}")
            out.update(forwards=int(lookup[1]), accepted=int(lookup[3]), drafted=int(lookup[4]))
    except (KeyError, IndexError) as e:
        raise ValueError(f"kvcore-run printed no {e} line: {stdout!r}") from e
    for phase in ("prefill", "decode"):
        ms = out[f"{phase}_ms"]
        out[f"{phase}_tokens_per_s"] = round(1e3 * out[f"{phase}_tokens"] / ms) if ms > 0 else None
    return out


def run_runner(runner: str, pte: Path, prompt: list[int], n_new: int, lookup: int,
               timeout: float = RUNNER_TIMEOUT) -> tuple[Optional[dict[str, Any]], str]:  # fmt: skip
    """One ``kvcore-run`` call on program ``pte``: ``prompt`` (token ids), ``n_new`` tokens,
    ``--lookup lookup`` when not 0, at most ``timeout`` seconds. (its parsed output, "") or
    (None, why it failed: its exit status and stderr, a timeout, unreadable output)."""
    argv = [runner, str(pte), "--tokens", ",".join(map(str, prompt)), "--new", str(n_new)]
    if lookup:
        argv += ["--lookup", str(lookup)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{' '.join(argv[:2])}: {e}"
    if done.returncode != 0:
        return None, f"kvcore-run exited with {done.returncode}: {done.stderr.strip()}"
    try:
        return parse_runner_output(done.stdout), ""
    except ValueError as e:
        return None, str(e)


def _greedy_in_pytorch(model: Any, prompt: list[int], n_new: int) -> list[int]:
    """``n_new`` greedy tokens of the tiny model in plain PyTorch (the whole sequence each time)."""
    import torch

    tokens = list(prompt)
    for _ in range(n_new):
        tokens.append(int(model.reference(torch.tensor([tokens]))[0, -1].argmax()))
    return tokens[len(prompt) :]


def same_tokens(theirs: list[int], ours: Optional[list[int]]) -> tuple[bool, str]:
    """Whether ``ours`` (None: the run failed) equals ``theirs``, and a line saying how many
    tokens are equal and where the first difference is."""
    if ours is None:
        return False, "kvcore-run did not run"
    same = sum(a == b for a, b in zip(theirs, ours))
    first = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), None)
    where = "" if first is None else f", first difference at generated token {first}"
    return ours == theirs, f"{same}/{len(theirs)} tokens equal{where}"


def run_executorch_demo(opts: ExecutorchDemoOptions, progress: Progress) -> dict[str, Any]:
    """Exports the tiny model, runs it with ``kvcore-run`` (greedy, then with ``--lookup``),
    decodes it greedily in PyTorch and compares; the report (``ok``, the model, speeds in
    tokens/s, bytes, the checks). ``opts.check()`` must have passed (it finds the runner)."""
    import torch

    from kvcore.integrations.executorch_tiny import export_tiny

    runner = find_runner(opts.runner)
    assert runner is not None, "opts.check() finds the runner first"
    config = opts.tiny_config()
    steps = 3 + (1 if opts.lookup else 0)
    progress.update("export", 0, steps)
    start = time.perf_counter()
    # torch.export and ExecuTorch warn about their own internals (deprecations): not the demo's to show.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, pte = export_tiny(config)
    export_seconds = time.perf_counter() - start
    # A random phrase of PHRASE tokens, repeated: prompt lookup finds drafts in it (some accepted, some not).
    phrase = torch.randint(0, config.vocab_size, (PHRASE,), generator=torch.Generator().manual_seed(opts.seed + 1))
    prompt = (phrase.tolist() * opts.prompt_len)[: opts.prompt_len]
    runs: dict[str, Optional[dict[str, Any]]] = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kvcore-demo-") as tmp:
        path = Path(tmp) / "tiny.pte"
        path.write_bytes(pte)
        progress.update("kvcore-run", 1, steps)
        runs["greedy"], errors["greedy"] = run_runner(runner, path, prompt, opts.gen_len, 0)
        if opts.lookup:
            progress.update("--lookup", 2, steps)
            runs["lookup"], errors["lookup"] = run_runner(runner, path, prompt, opts.gen_len, opts.lookup)
    progress.update("pytorch", steps - 1, steps)
    start = time.perf_counter()
    with torch.no_grad():
        theirs = _greedy_in_pytorch(model, prompt, opts.gen_len)
    pytorch_seconds = time.perf_counter() - start
    progress.close()

    ring_rows = opts.window + opts.max_step - 1
    checks = []
    for name, label in (("greedy", "kvcore-run's greedy tokens equal PyTorch's"),
                        ("lookup", f"kvcore-run --lookup {opts.lookup}'s tokens equal PyTorch's greedy ones")):
        if name not in runs:
            continue
        run = runs[name]
        ok, detail = same_tokens(theirs, run["tokens"] if run else None)
        checks.append(check_entry(label, ok, detail if run else errors[name]))
    return {
        "ok": all(c["ok"] for c in checks),
        "runtime": "executorch",
        "runner": runner,
        "model": {"layers": config.metadata().describe(), "vocab_size": config.vocab_size, "dim": config.dim,
                  "n_heads": config.n_heads, "n_kv_heads": config.n_kv_heads, "head_dim": config.head_dim,
                  "seed": opts.seed},  # fmt: skip
        "pte_bytes": len(pte),
        "export_seconds": round(export_seconds, 2),
        "prompt_tokens": opts.prompt_len,
        "generated_tokens": opts.gen_len,
        "max_step": opts.max_step,
        "ring_rows": ring_rows,
        "ring_wrapped": opts.capacity - 1 > ring_rows,
        "prompt": prompt,
        "pytorch_tokens": theirs,
        "pytorch_seconds": round(pytorch_seconds, 3),
        "greedy": runs.get("greedy"),
        "lookup": runs.get("lookup"),
        "lookup_n": opts.lookup,
        "checks": checks,
    }


def speeds(run: dict[str, Any]) -> str:
    """One runner run's prefill and decode: tokens, time (ms below a second, else s) and tokens/s."""
    def took(ms: float) -> str:
        return f"{ms:.2f} ms" if ms < 1000 else f"{ms / 1e3:.1f} s"

    return (f"prefill {run['prefill_tokens']} tokens in {took(run['prefill_ms'])} ({run['prefill_tokens_per_s']} "
            f"tokens/s), decode {run['decode_tokens']} in {took(run['decode_ms'])} ({run['decode_tokens_per_s']} "
            "tokens/s)")  # fmt: skip


def format_report(r: dict[str, Any]) -> str:
    """The report of ``run_executorch_demo`` as text."""
    m = r["model"]
    lines = [
        f"kvcore demo --runtime executorch: a tiny random decoder ({m['layers']}; vocab {m['vocab_size']}, "
        f"{m['n_heads']} query heads, {m['n_kv_heads']} KV heads of {m['head_dim']}) exported to a .pte of "
        f"{r['pte_bytes']} bytes in {r['export_seconds']} s,",
        f"  run by {r['runner']} (ExecuTorch's C++ runtime, kvcore's kernel behind kvcache::update_and_attend)",
        f"  prompt {r['prompt_tokens']} tokens in forwards of at most {r['max_step']}, {r['generated_tokens']} "
        f"generated; the ring's {r['ring_rows']} rows " + ("wrap" if r["ring_wrapped"] else "do not wrap"),
    ]
    if r["greedy"]:
        lines.append(f"  greedy: {speeds(r['greedy'])}; {r['greedy']['cache_bytes']} bytes of K/V")
    if r["lookup"]:
        g = r["lookup"]
        lines.append(f"  --lookup {r['lookup_n']}: {speeds(g)}; {g['forwards']} forwards, {g['accepted']} of "
                     f"{g['drafted']} drafted tokens accepted")  # fmt: skip
    lines.append(f"  PyTorch (no cache, the whole sequence per token): {r['pytorch_seconds']} s")
    return "\n".join([*lines, *format_checks(r)])


__all__ = ["BUILD_HINT", "ExecutorchDemoOptions", "find_runner", "format_report", "parse_runner_output",
           "run_executorch_demo", "run_runner", "same_tokens"]  # fmt: skip
