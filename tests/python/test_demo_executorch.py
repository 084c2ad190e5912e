"""``kvcore demo --runtime executorch`` (issue 40, item 5): a tiny random model exported to a
``.pte`` and run by ``kvcore-run`` (ExecuTorch's C++ runtime, kvcore's kernel behind
``kvcache::update_and_attend``), its tokens checked against the same model in PyTorch.

- The command line's run: greedy tokens through a chunked prefill past the ring's wrap, and
  with ``--lookup`` (drafts accepted and rejected, so rewinds happened), equal PyTorch's; the
  report has the speeds, the bytes and the checks, as JSON and as text.
- A runner whose tokens differ makes the check fail (exit 1): the check can fail.
- Refusals before anything is exported: each bad option is one line naming the value and the
  rule, and so is a missing ``kvcore-run`` (naming what to build).

One export of the tiny model (about 5 s) for the module. ``kvcore-run`` is found beside
``$KVCORE_EXECUTORCH_OPS`` (scripts/test.sh sets it); without it these tests skip, visibly.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest
from needs import need

need("torch", reason="the ExecuTorch demo needs torch")
need(
    "executorch.extension.llm.cache.update_and_attend",
    reason="the ExecuTorch demo needs executorch==1.5.1 (installed with --no-deps) and ruamel.yaml, flatbuffers, "
    "tabulate (scripts/test.sh installs them)",
)

from kvcore import cli  # noqa: E402
from kvcore_demo import executorch_runtime as demo  # noqa: E402
from kvcore.integrations import executorch_tiny  # noqa: E402

LIBRARY = os.environ.get(demo.KERNEL_LIBRARY_ENV)
pytestmark = pytest.mark.skipif(
    not LIBRARY,
    reason=f"kvcore-run was not built: set ${demo.KERNEL_LIBRARY_ENV} to BUILD/cpp/executorch/libkvcore_executorch_ops.so "
    "(cmake --build BUILD --target kvcore_executorch_ops kvcore-run)",
)
COMMAND = "kvcore demo --runtime executorch"

_exports: dict[str, tuple[Any, bytes]] = {}
_real_export = executorch_tiny.export_tiny


def _cached_export(config: Any = None) -> tuple[Any, bytes]:
    """export_tiny, once per config for the module (the demo imports it when it runs)."""
    key = repr(config)
    if key not in _exports:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _exports[key] = _real_export(config)
    return _exports[key]


@pytest.fixture(autouse=True)
def _one_export_and_no_preload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executorch_tiny, "export_tiny", _cached_export)
    # The sanitizer run preloads the ASan runtime into Python; a sanitized kvcore-run carries its own.
    monkeypatch.delenv("LD_PRELOAD", raising=False)


def test_the_command_line_runs_it_and_its_tokens_equal_pytorchs(capsys: Any) -> None:
    assert cli.main(["demo", "--runtime", "executorch", "--json", "--no-progress"]) == 0
    r = json.loads(capsys.readouterr().out)
    d = demo.ExecutorchDemoOptions()
    assert r["ok"] and [c["ok"] for c in r["checks"]] == [True, True]
    assert r["model"]["layers"] == f"flat, ring({d.window}), flat"
    assert r["ring_wrapped"] and d.prompt_len > r["ring_rows"]  # the prompt alone wraps the ring
    assert len(r["pytorch_tokens"]) == d.gen_len
    for name in ("greedy", "lookup"):
        run = r[name]
        assert run["tokens"] == r["pytorch_tokens"], name
        assert run["prefill_tokens"] == d.prompt_len and run["decode_tokens"] == d.gen_len - 1
        assert run["prefill_tokens_per_s"] > 0 and run["decode_tokens_per_s"] > 0 and run["cache_bytes"] > 0
    lookup = r["lookup"]
    assert 0 < lookup["accepted"] < lookup["drafted"]  # drafts accepted and rejected: rewinds happened
    assert lookup["forwards"] + lookup["accepted"] == d.gen_len - 1
    text = demo.format_report(r)
    assert "[ok] kvcore-run's greedy tokens equal PyTorch's: 40/40 tokens equal" in text
    assert f"[ok] kvcore-run --lookup {d.lookup}'s tokens equal PyTorch's greedy ones" in text
    assert "tokens/s" in text and text.endswith("result: all checks passed")


def test_a_runner_with_other_tokens_fails_the_check(tmp_path: Path, capsys: Any) -> None:
    """A kvcore-run stand-in printing kvcore-run's lines with token 0 throughout: the check fails
    and names where, and the demo exits 1."""
    d = demo.ExecutorchDemoOptions(lookup=0)
    fake = tmp_path / "kvcore-run"
    fake.write_text("#!/bin/sh\n"
                    f"echo 'tokens: {' '.join(['0'] * d.gen_len)}'\n"
                    f"echo 'prefill: {d.prompt_len} tokens in 1.00 ms (24000 tokens/s); decode: {d.gen_len - 1} tokens "
                    "in 2.00 ms (19500 tokens/s)'\n"
                    "echo 'cache: 3 layers, length 63, 100 bytes of K/V'\n")  # fmt: skip
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert cli.main(["demo", "--runtime", "executorch", "--lookup", "0", "--runner", str(fake), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] kvcore-run's greedy tokens equal PyTorch's:" in out and "first difference at generated token" in out
    assert "kvcore-run --lookup" not in out and out.endswith("result: CHECKS FAILED\n")  # --lookup 0: no such run


def test_parse_runner_output_reads_kvcore_runs_lines() -> None:
    out = demo.parse_runner_output(
        "tokens: 6 36 3\nprefill: 6 tokens in 2.00 ms (3000 tokens/s); decode: 2 tokens in 0.50 ms (4000 tokens/s)\n"
        "cache: 3 layers, length 8, 18687 bytes of K/V\nlookup: 1 forwards for 2 tokens, 1 of 3 drafted tokens accepted\n"
    )
    assert out["tokens"] == [6, 36, 3] and out["cache_bytes"] == 18687
    assert (out["prefill_tokens_per_s"], out["decode_tokens_per_s"]) == (3000, 4000)
    assert (out["forwards"], out["accepted"], out["drafted"]) == (1, 1, 3)
    with pytest.raises(ValueError, match="kvcore-run printed no 'tokens' line"):
        demo.parse_runner_output("kvcore-run: cannot load x.pte\n")


def _refused(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: Any) -> str:
    monkeypatch.setattr(executorch_tiny, "export_tiny", lambda *a: pytest.fail("exported before the options were checked"))
    try:
        code = cli.main(["demo", "--runtime", "executorch", *argv])
    except SystemExit as e:  # argparse's own refusals (a choice, a type) exit
        code = int(str(e.code))
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{COMMAND}: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(("argv", "message"), [
    (["--gen-len", "0"], "--gen-len = 0: must be >= 1"),
    (["--window", "0"], "--window = 0: must be >= 1"),
    (["--lookup", "8"], "--lookup = 8: must be <= --max-step - 1 = 7"),
    (["--max-step", "70"], "--max-step = 70: must be <= 64, the longest sequence of this run"),
    (["--prompt-len", "1000", "--gen-len", "100"], "--prompt-len + --gen-len = 1100: must be <= 1024"),
    (["--runner", "/nonexistent/kvcore-run"], "--runner /nonexistent/kvcore-run: no such executable file; build it"),
    (["--runtime", "tflite"], "argument --runtime: invalid choice: 'tflite'"),
])  # fmt: skip
def test_a_bad_option_is_refused_before_the_export(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    assert message in _refused(argv, monkeypatch, capsys)


def test_no_runner_is_refused_naming_what_to_build(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    for name in (demo.RUNNER_ENV, demo.KERNEL_LIBRARY_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    err = _refused([], monkeypatch, capsys)
    assert "no kvcore-run found" in err and "cmake --build build/et --target kvcore-run" in err


def test_its_help_is_its_own_and_the_plain_demo_points_to_it(capsys: Any) -> None:
    for argv in (["--runtime", "executorch", "--help"], ["demo", "--runtime", "executorch", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: {COMMAND}") and "--lookup" in out and "--runner" in out
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "--runtime {executorch}" in capsys.readouterr().out


# --- --model gemma-3-270m: the real model, exported once and cached ----------------------


@pytest.mark.parametrize(("argv", "message"), [
    (["--gen-len", "0"], "--gen-len = 0: must be in [1, 1024]"),
    (["--lookup", "64"], "--lookup = 64: must be in [0, 63]"),
    (["--runner", "/nonexistent/kvcore-run"], "--runner /nonexistent/kvcore-run: no such executable file"),
])  # fmt: skip
def test_the_real_models_options_are_refused_before_it_loads(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from kvcore.integrations import transformers_models as real_model

    monkeypatch.setattr(real_model, "load", lambda *a: pytest.fail("loaded before the options were checked"))
    assert cli.main(["demo", "--runtime", "executorch", "--model", "gemma-3-270m", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{COMMAND} --model gemma-3-270m: error: {message}") and err.count("\n") == 1, err


def test_the_real_model_without_its_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import sys

    from kvcore.integrations import transformers_models as real_model

    monkeypatch.setitem(sys.modules, real_model.MODELS["gemma-3-270m"], None)
    assert cli.main(["demo", "--runtime", "executorch", "--model", "gemma-3-270m"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{COMMAND} --model gemma-3-270m: error: ") and 'pip install "kvcore[gemma]"' in err
    assert err.count("\n") == 1


#: As in test_executorch_runtime.py: the real model's export takes minutes; only on request.
if os.environ.get("KVCORE_GEMMA_EXPORT") == "1":

    def test_the_real_models_tokens_equal_transformers(capsys: Any) -> None:
        """The demo on Gemma 3 270M (the gemma extra): the cached program's greedy and --lookup
        tokens past the 512-token window equal transformers' generate()."""
        from kvcore.integrations import transformers_models as real_model

        need(real_model.MODELS["gemma-3-270m"], reason='the real model needs the gemma extra: pip install "kvcore[gemma]"')
        assert cli.main(["demo", "--runtime", "executorch", "--model", "gemma-3-270m", "--gen-len", "24", "--json",
                         "--no-progress"]) == 0  # fmt: skip
        r = json.loads(capsys.readouterr().out)
        assert r["ok"] and r["prompt_tokens"] > r["window"] and len(r["checks"]) == 2
        assert r["greedy"]["tokens"] == r["lookup"]["tokens"] == r["transformers_tokens"]
