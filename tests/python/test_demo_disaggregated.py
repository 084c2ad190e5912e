"""``kvcore demo --disaggregated`` on this machine: two prefill actors and a decode actor
(three processes besides the driver) on a local Ray instance; every chat's tokens and
logits must equal single-process decoding, and the decode actor must share the system
prompt it holds instead of writing it again. One Ray start for the module (num_cpus=2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from needs import need

ray = need("ray", reason="the distributed extra (ray) is not installed: pip install 'kvcore[distributed]'")

from kvcore import cli  # noqa: E402
from kvcore_demo.disaggregated import DisaggregatedOptions, format_report, run_disaggregated  # noqa: E402


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_prefill_and_decode_on_ray_match_one_process(local_ray: None) -> None:
    opts = DisaggregatedOptions(chats=3, system_len=32, prompt_len=10, gen_len=6)
    r = run_disaggregated(opts)
    assert r["ok"], r["problems"]
    # The system prompt's two full blocks of each chat came from the decode actor's own
    # sequence: the flat group wrote only each chat's own blocks.
    assert r["flat_blocks_written"] == opts.chats * (-(-(32 + 10) // 16) - 2)
    assert r["record_bytes"] > 0


def test_a_model_without_a_flat_layer_reports_no_flat_blocks(local_ray: None) -> None:
    # --layers below flat_every (6): every layer is a ring, and no ring group's count poses as the flat one's.
    r = run_disaggregated(DisaggregatedOptions(chats=2, layers=3, prompt_len=4, gen_len=2))
    assert r["ok"], r["problems"]
    assert r["flat_blocks_written"] is None and r["flat_blocks_without_sharing"] is None
    assert "no flat layer" in format_report(r)


def test_the_command_line_runs_it(local_ray: None, capsys: Any) -> None:
    code = cli.main(["demo", "--disaggregated", "--chats", "2", "--gen-len", "3", "--prompt-len", "5", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    assert report["ok"] and report["chats"] == 2 and report["prefill_actors"] == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--prefill-actors", "0"], "--prefill-actors = 0: must be >= 1"),
    (["--chats", "0"], "--chats = 0: must be >= 1"),
    (["--block-size", "0"], "--block-size = 0: must be >= 1"),
    (["--gen-len", "3", "--max-step", "57"], "--max-step = 57: must be <= 56, the longest sequence of this run"),
])
def test_an_option_it_cannot_honour_is_refused_before_ray_starts(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started before the options were checked"))
    assert cli.main(["demo", "--disaggregated", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvcore demo --disaggregated: error: {message}") and err.count("\n") == 1


def test_its_model_is_model_configs_own_shape() -> None:
    # The options reuse ModelOptions (validation, dtype, model) with ModelConfig's defaults.
    from kvcore_demo.model import ModelConfig

    assert DisaggregatedOptions().model_config() == ModelConfig()


def test_its_help_is_its_own_with_or_without_demo(capsys: Any) -> None:
    for argv in (["--disaggregated", "--help"], ["demo", "--disaggregated", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 0 and "--prefill-actors" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "--disaggregated" in capsys.readouterr().out
