"""kvcore.memory: preset totals against hand arithmetic, the budget search against
a brute-force scan, and the `kvcore memory` command's output and exit codes.

Hand arithmetic uses DESIGN's rows rule: a sliding layer holds
min(context, sinks + window + max_step - 1) rows, a full layer `context` rows;
a row costs n_kv_heads x (head_dim + v_head_dim) x dtype bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from needs import need

import kvcore
from kvcore import memory
from kvcore.cli import main
from kvcore.hf_config import EmptyLayer, ModelShape
from kvcore.memory import MAX_CONTEXT, kv_bytes, longest_context, parse_context, parse_size, plan_memory, preset

GiB = 2**30


def shape_of(name: str) -> ModelShape:
    return preset(name).shape


# --- totals against hand arithmetic ----------------------------------------------------


def test_gemma_3_27b_at_128k() -> None:
    plan = plan_memory(shape_of("gemma-3-27b"), context=131072, max_step=512, dtype="bfloat16")
    row = 16 * (128 + 128) * 2  # 16 KV heads, K and V of 128, bf16
    sliding = 52 * (1024 + 512 - 1) * row  # 62 layers, every 6th full: 10 full, 52 sliding
    full = 10 * 131072 * row
    assert plan.total_bytes == sliding + full == 11_391_303_680
    assert plan.flat_total_bytes == 62 * 131072 * row
    assert plan.ratio == pytest.approx((sliding + full) / (62 * 131072 * row))
    by_kind = {k.kind: k for k in plan.kinds}
    assert (len(by_kind["sliding"].layers), by_kind["sliding"].rows, by_kind["sliding"].window) == (52, 1535, 1024)
    assert by_kind["full"].layers == tuple(range(5, 62, 6))
    assert by_kind["full"].rows == 131072
    assert by_kind["full"].bytes_per_layer == 131072 * row == GiB


def test_mistral_7b_every_layer_a_ring() -> None:
    plan = plan_memory(shape_of("mistral-7b-v0.1"), context=32768, dtype="float16")
    row = 8 * (128 + 128) * 2
    assert plan.max_step == 512  # kvcore's default, min(512, context)
    assert [(k.kind, len(k.layers), k.rows) for k in plan.kinds] == [("sliding", 32, 4096 + 512 - 1)]
    assert plan.total_bytes == 32 * 4607 * row == 603_848_704
    assert plan.flat_total_bytes == 32 * 32768 * row == 4 * GiB


def test_gpt_oss_20b_with_sinks_and_a_batch() -> None:
    plan = plan_memory(shape_of("gpt-oss-20b"), context=131072, max_step=256, sinks=4, dtype="float8", batch=3)
    row = 8 * (64 + 64) * 1  # fp8
    sliding = 12 * (4 + 128 + 256 - 1) * row * 3
    full = 12 * 131072 * row * 3
    assert plan.total_bytes == sliding + full
    assert plan.dtype == "float8_e4m3fn" and plan.dtype_bytes == 1


def test_llama_has_nothing_to_save() -> None:
    plan = plan_memory(shape_of("llama-3.1-8b"), context=8192)
    assert plan.total_bytes == plan.flat_total_bytes == 32 * 8192 * 8 * 256 * 2 == GiB
    assert plan.ratio == 1.0


def test_context_inside_the_window_never_wraps() -> None:
    plan = plan_memory(shape_of("gemma-3-1b"), context=1000, max_step=100)
    # 512 + 100 - 1 = 611 < 1000 still wraps; at context 600 it would not.
    assert {k.kind: k.rows for k in plan.kinds} == {"sliding": 611, "full": 1000}
    small = plan_memory(shape_of("gemma-3-1b"), context=600, max_step=100)
    assert {k.kind: k.rows for k in small.kinds} == {"sliding": 600, "full": 600}
    assert small.total_bytes == small.flat_total_bytes


def test_rows_are_the_caches_own_rows() -> None:
    shape = shape_of("command-r7b")
    plan = plan_memory(shape, context=50000, max_step=128, sinks=2)
    cache = kvcore.SequenceCache(shape.cache_config(50000, max_step=128, sinks=2))
    for kind in plan.kinds:
        for layer in kind.layers:
            assert cache.rows(layer) == kind.rows
    assert sorted(i for k in plan.kinds for i in k.layers) == list(range(shape.n_layers))


def test_v_head_dim_counts_for_v_rows() -> None:
    shape = ModelShape(name="toy", model_type="", n_kv_heads=2, head_dim=64, v_head_dim=32, windows=(None,))
    assert kv_bytes(shape, 10, dtype="float32") == 10 * 2 * (64 + 32) * 4


@pytest.mark.parametrize(("dtype", "size"), [("float32", 4), ("fp16", 2), ("bf16", 2), ("int8", 1), ("FP8", 1)])
def test_dtype_sizes(dtype: str, size: int) -> None:
    assert memory.dtype_bytes(dtype)[1] == size


def test_bad_dtype_and_batch_are_named() -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=r"dtype = 'int4': must be one of float32"):
        plan_memory(shape_of("gemma-3-1b"), dtype="int4")
    with pytest.raises(kvcore.InvalidArgumentError, match=r"batch = 0: must be an integer >= 1"):
        plan_memory(shape_of("gemma-3-1b"), batch=0)


# --- budget search ---------------------------------------------------------------------------


def test_budget_for_llama_is_budget_over_bytes_per_token() -> None:
    per_token = 32 * 8 * 256 * 2
    assert longest_context(shape_of("llama-3.1-8b"), GiB) == GiB // per_token == 8192
    assert longest_context(shape_of("llama-3.1-8b"), GiB - 1) == 8191


def test_budget_for_gemma_3_27b() -> None:
    row = 16 * 256 * 2
    sliding = 52 * 1535 * row  # the rings are full long before the answer
    expected = (8 * GiB - sliding) // (10 * row)
    assert longest_context(shape_of("gemma-3-27b"), 8 * GiB, max_step=512) == expected == 96875
    assert longest_context(shape_of("gemma-3-27b"), 8 * GiB, all_flat=True) == 8 * GiB // (62 * row)


def test_budget_when_every_layer_is_a_ring() -> None:
    assert longest_context(shape_of("mistral-7b-v0.1"), GiB) == MAX_CONTEXT


def test_budget_too_small_is_an_error() -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=r"budget = 100 bytes .* too small, even a context of 1 needs"):
        longest_context(shape_of("gemma-3-1b"), 100)
    # With a fixed max_step the shortest cache holds one whole step.
    with pytest.raises(kvcore.InvalidArgumentError, match=r"even a context of 512 needs"):
        longest_context(shape_of("gemma-3-1b"), 26 * 512 * 1024 - 1, max_step=512)


@pytest.mark.parametrize("budget_rows", [3, 7, 8, 9, 20, 31, 32, 33, 100])
def test_budget_matches_a_brute_force_scan(budget_rows: int) -> None:
    # Two rings (W=5, sinks 1) and a flat layer: growth changes slope where the rings fill.
    shape = ModelShape(name="toy", model_type="", n_kv_heads=1, head_dim=1, windows=(5, None, 5))
    row = 1 * (1 + 1) * 4  # float32
    budget = budget_rows * row
    contexts = [c for c in range(1, 200) if kv_bytes(shape, c, sinks=1, max_step=None, dtype="float32") <= budget]
    assert contexts, "the budget holds at least one token"
    assert longest_context(shape, budget, sinks=1, dtype="float32") == max(contexts)


def test_bad_budget_is_named() -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=r"budget = 0"):
        longest_context(shape_of("gemma-3-1b"), 0)


# --- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("8GiB", 8 * GiB), ("512 MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("100", 100), ("2kb", 2000),
     ("1TiB", 2**40)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["8 GiBs", "abc", "0", "-1GiB", "GiB", ""])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=r"size .*: must be"):
        parse_size(text)


def test_parse_context() -> None:
    assert parse_context("128k") == 131072
    assert parse_context("8192") == 8192
    with pytest.raises(kvcore.InvalidArgumentError, match=r"context '1.5k'"):
        parse_context("1.5k")


def test_format_bytes() -> None:
    assert memory.format_bytes(512) == "512 B"
    assert memory.format_bytes(12_574_720) == "12.0 MiB"
    assert memory.format_bytes(GiB) == "1.0 GiB"


# --- presets -----------------------------------------------------------------------------------


ISSUE_PRESETS = ["gemma-2-2b", "gemma-2-9b", "gemma-2-27b", "gemma-3-1b", "gemma-3-4b", "gemma-3-12b",
                 "gemma-3-27b", "llama-3.1-8b", "mistral-7b-v0.1", "qwen2.5-7b"]


def test_presets_cover_the_issue_and_cite_their_source() -> None:
    table = memory.presets()
    assert set(ISSUE_PRESETS) <= set(table)
    more = [p for name, p in table.items() if name not in ISSUE_PRESETS and any(p.shape.windows)]
    assert len(more) >= 2  # at least two more current models with sliding-window layers
    for p in table.values():
        assert p.source.startswith("https://huggingface.co/"), p.name
        assert p.hf_id in p.source, p.name
        assert p.pattern, p.name
        assert p.shape.defaults == (), f"{p.name} relies on defaults: {p.shape.defaults}"
        assert p.shape.max_position_embeddings is not None


def test_presets_file_ships_in_the_package() -> None:
    # Read as package data, the way an installed wheel provides it.
    from importlib import resources

    data = json.loads(resources.files("kvcore").joinpath("presets.json").read_text(encoding="utf-8"))
    assert [e["name"] for e in data["presets"]] == list(memory.presets())


def test_preset_lookup() -> None:
    assert preset("Gemma-3-27B").name == "gemma-3-27b"
    with pytest.raises(kvcore.NotFoundError, match=r"model 'gemma-9': no such preset; presets: gemma-2-2b"):
        preset("gemma-9")


# --- the command line ---------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["memory", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--model", "gemma-3-27b", "--context", "128k")
    assert code == 0 and err == ""
    assert "11,391,303,680 B" in out
    assert "66,571,993,088 B" in out  # 62 layers x 1 GiB, all flat
    assert "52 sliding + 10 full" in out


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--model", "mistral-7b-v0.1", "--context", "32768", "--dtype", "fp16", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["total_bytes"] == 32 * 4607 * 8 * 256 * 2
    assert data["all_flat"]["total_bytes"] == 4 * GiB
    assert data["kinds"][0]["rows"] == 4607 and data["kinds"][0]["layers"] == 32


def test_cli_budget(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--model", "gemma-3-27b", "--budget", "8GiB", "--max-step", "512", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["budget"]["longest_context"] == 96875
    assert data["context"] == 96875
    assert data["total_bytes"] <= 8 * GiB


def test_cli_budget_uncapped_model_keeps_its_context(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--model", "mistral-7b-v0.1", "--budget", "1GiB")
    assert code == 0
    assert f"longest context {MAX_CONTEXT:,}" in out
    assert "context 32,768," in out


def test_cli_hf_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
                                "num_hidden_layers": 34, "hidden_size": 2560, "sliding_window": 1024}}))
    code, out, _ = run_cli(capsys, "--hf-config", str(path), "--context", "4096")
    assert code == 0
    assert "num_key_value_heads=4 (transformers Gemma3TextConfig default)" in out


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--list")
    assert code == 0
    for name in ISSUE_PRESETS:
        assert name in out
    code, out, _ = run_cli(capsys, "--list", "--json")
    assert {e["name"] for e in json.loads(out)} == set(memory.presets())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "give --model NAME, --hf-config PATH or --list"),
        (("--model", "nope"), "model 'nope': no such preset"),
        (("--model", "gemma-3-1b", "--dtype", "int4"), "dtype = 'int4'"),
        (("--model", "gemma-3-1b", "--budget", "10B"), "too small"),
        (("--model", "gemma-3-1b", "--context", "100", "--max-step", "200"), "max_step = 200: must be <= context = 100"),
        (("--hf-config", "/nonexistent/config.json"), "cannot read Hugging Face config"),
    ],
)
def test_cli_bad_input_exits_2(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert out == ""
    assert message in err
    # One line, prefixed once with the command, pointing to its --help.
    assert err.count("\n") == 1 and err.startswith("kvcore memory: error: ") and err.count("kvcore") == 2
    assert err.endswith("; see kvcore memory --help\n")


@pytest.mark.parametrize("context", ["3000000000", "2097152k"])
def test_cli_an_oversized_context_is_named_as_the_option(capsys: pytest.CaptureFixture[str], context: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["memory", "--model", "gemma-3-1b", "--context", context])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvcore memory: error: argument --context: context '{context}': ")
    assert "must be <= 2147483647" in err and "capacity" not in err


def test_an_oversized_context_is_named_by_the_api() -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=r"^context = 2147483648: must be <= 2147483647"):
        plan_memory(shape_of("gemma-3-1b"), context=MAX_CONTEXT + 1)


def test_cli_malformed_hf_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    code, _, err = run_cli(capsys, "--hf-config", str(path))
    assert code == 2 and "is not valid JSON" in err


@pytest.mark.parametrize(
    "argv",
    [("--model", "gemma-3-1b", "--context", "abc"), ("--model", "gemma-3-1b", "--hf-config", "x.json"),
     ("--model", "gemma-3-1b", "--batch", "0"), ("--model", "gemma-3-1b", "--budget", "lots")],
)
def test_cli_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["memory", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    # One line, the option named, a pointer to --help: no usage block before it.
    assert err.count("\n") == 1 and "usage" not in err
    assert err.startswith("kvcore memory: error: argument --") and err.endswith("; see kvcore memory --help\n")


def test_cli_exit_status_of_the_process() -> None:
    ok = subprocess.run([sys.executable, "-m", "kvcore", "memory", "--model", "gemma-3-1b"], capture_output=True)
    bad = subprocess.run([sys.executable, "-m", "kvcore", "memory", "--model", "nope"], capture_output=True)
    assert (ok.returncode, bad.returncode) == (0, 2)


def test_cli_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out_png = tmp_path / "kv.png"
    code, _, err = run_cli(capsys, "--model", "gemma-3-1b", "--plot", str(out_png))
    assert code == 1
    assert "--plot needs matplotlib" in err and "kvcore[plot]" in err
    assert not out_png.exists()


def test_cli_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    need("matplotlib")
    out_png = tmp_path / "kv.png"
    code, _, _ = run_cli(capsys, "--model", "gemma-3-1b", "--budget", "64MiB", "--plot", str(out_png))
    assert code == 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = run_cli(capsys, "--model", "gemma-3-1b", "--plot", str(tmp_path / "missing" / "kv.png"))
    assert code == 2 and "cannot write it" in err


# --- chunked, shared and state layers (docs/design.md section 9) -----------------------------
# Bytes below come from the formulas of docs/memory.md ("Chunked, shared and state layers"),
# worked by hand from the published configs, never from the planner.

BF16 = 2


def kinds_of(plan: memory.MemoryPlan) -> dict[str, memory.LayerKind]:
    return {k.kind: k for k in plan.kinds}


def test_llama_4_scout_chunked_layers_hold_a_chunk_plus_a_step() -> None:
    plan = plan_memory(shape_of("llama-4-scout"), context=131072, max_step=512)
    row = 8 * (128 + 128) * BF16
    by_kind = kinds_of(plan)
    # Layers 3, 7, ..., 47 are full (NoPE); the other 36 chunk by 8192.
    assert by_kind["full"].layers == tuple(range(3, 48, 4))
    assert (len(by_kind["chunked"].layers), by_kind["chunked"].rows, by_kind["chunked"].chunk) == (36, 8192 + 511, 8192)
    assert plan.total_bytes == 36 * 8703 * row + 12 * 131072 * row
    assert plan.flat_total_bytes == 48 * 131072 * row
    # A context inside one chunk: rows never exceed the capacity.
    small = plan_memory(shape_of("llama-4-scout"), context=4096, max_step=512)
    assert kinds_of(small)["chunked"].rows == 4096


def test_gemma_3n_shared_layers_cost_nothing_and_read_their_source() -> None:
    plan = plan_memory(shape_of("gemma-3n-e4b"), context=32768, max_step=512)
    row = 2 * (256 + 256) * BF16
    by_kind = kinds_of(plan)
    # Layers 0-19 write K/V (every 5th full); 20-34 share: sliding ones read 18, full ones (24, 29, 34) read 19.
    assert by_kind["sliding"].layers == tuple(i for i in range(20) if (i + 1) % 5)
    assert by_kind["full"].layers == (4, 9, 14, 19)
    assert by_kind["shared"].layers == tuple(range(20, 35))
    assert by_kind["shared"].sources == tuple(19 if (i + 1) % 5 == 0 else 18 for i in range(20, 35))
    assert by_kind["shared"].rows == 0 and by_kind["shared"].total_bytes == 0
    assert plan.total_bytes == 16 * (512 + 511) * row + 4 * 32768 * row
    assert plan.flat_total_bytes == 20 * 32768 * row  # the baseline keeps sharing: only windows differ


def gated_deltanet_bytes(nk: int, dk: int, nv: int, dv: int, kernel: int) -> int:
    return (2 * nk * dk + nv * dv) * kernel * BF16 + nv * dk * dv * 4  # conv bf16, recurrent fp32


def mamba2_bytes(hidden: int, expand: int, heads: int, d_head: int, groups: int, d_state: int, d_conv: int) -> int:
    return (expand * hidden + 2 * groups * d_state) * d_conv * BF16 + heads * d_head * d_state * 4


@pytest.mark.parametrize(
    ("name", "n_state", "snapshot", "full_layers", "row"),
    [
        ("qwen3-next-80b-a3b", 36, gated_deltanet_bytes(16, 128, 32, 128, 4), 12, 2 * 512 * BF16),
        ("lfm2-1.2b", 10, 2048 * 3 * BF16, 6, 8 * 128 * BF16),
        ("granite-4.0-h-small", 36, mamba2_bytes(4096, 2, 128, 64, 1, 128, 4), 4, 8 * 256 * BF16),
    ],
)  # fmt: skip
def test_state_layers_cost_d_snapshots(name: str, n_state: int, snapshot: int, full_layers: int, row: int) -> None:
    shape = shape_of(name)
    for slots in (1, 5):
        plan = plan_memory(shape, context=8192, max_step=256, state_slots=slots, batch=2)
        state = kinds_of(plan)["state"]
        assert (len(state.layers), state.rows, plan.state_slots) == (n_state, slots, slots)
        assert state.bytes_per_layer == slots * snapshot * 2
        assert plan.state_bytes_per_slot == n_state * snapshot * 2
        assert plan.total_bytes == n_state * slots * snapshot * 2 + full_layers * 8192 * row * 2
    # Default D: room for a verify step of up to 8 tokens (min(max_step, 8) + 1).
    assert plan_memory(shape, context=8192, max_step=256).state_slots == 9
    assert plan_memory(shape, context=8192, max_step=4).state_slots == 5


def test_qwen3_next_state_in_numbers() -> None:
    plan = plan_memory(shape_of("qwen3-next-80b-a3b"), context=262144, state_slots=1)
    # conv (2 x 16 x 128 + 32 x 128) x 4 columns bf16 = 64 KiB, recurrent 32 x 128 x 128 fp32 = 2 MiB.
    assert kinds_of(plan)["state"].state_conv_bytes == 64 * 2**10
    assert kinds_of(plan)["state"].state_recurrent_bytes == 2 * 2**20
    assert plan.state_bytes_per_slot == 36 * (64 * 2**10 + 2 * 2**20)


def test_state_rows_are_the_caches_own_rows() -> None:
    for name in ("gemma-3n-e4b", "qwen3-next-80b-a3b", "llama-4-scout"):
        shape = shape_of(name)
        plan = plan_memory(shape, context=20000, max_step=64, state_slots=3)
        cache = kvcore.SequenceCache(shape.cache_config(20000, max_step=64, state_slots=3))
        for kind in plan.kinds:
            for layer in kind.layers:
                assert cache.rows(layer) == kind.rows, (name, layer)


def test_layers_without_attention_or_state_cost_nothing() -> None:
    # Nemotron-H's "-" (MLP) and "E" (MoE) layers: transformers gives them a "dummy" cache layer.
    shape = ModelShape(name="toy", model_type="nemotron_h", n_kv_heads=2, head_dim=16, windows=(None, None, None),
                       special=(EmptyLayer("mlp"), None, EmptyLayer("moe")))  # fmt: skip
    row = 2 * (16 + 16) * BF16
    plan = plan_memory(shape, context=1000, max_step=8, batch=2)
    assert plan.total_bytes == plan.flat_total_bytes == 1000 * row * 2  # the one attention layer, batch 2
    assert (kinds_of(plan)["empty"].layers, kinds_of(plan)["empty"].rows, kinds_of(plan)["empty"].total_bytes) == (
        (0, 2), 0, 0,
    )  # fmt: skip
    assert plan.state_slots is None  # nothing recurrent either
    assert longest_context(shape, 1000 * row) == 1000


def test_budget_counts_the_state() -> None:
    shape = shape_of("lfm2-1.2b")
    state = 10 * 3 * (2048 * 3 * BF16)  # D = 3
    per_token = 6 * 8 * 128 * BF16
    assert longest_context(shape, state + 1000 * per_token, state_slots=3) == 1000


def test_bad_state_slots_are_named() -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=r"state_slots = 0: must be >= 1"):
        plan_memory(shape_of("lfm2-1.2b"), context=4096, state_slots=0)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"dtype = 'int4'"):
        plan_memory(shape_of("lfm2-1.2b"), context=4096, state_dtype="int4")


def test_cli_state_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--model", "qwen3-next-80b-a3b", "--context", "32k", "--state-slots", "4")
    assert code == 0 and err == ""
    assert "12 full + 36 state" in out
    assert "state slots D = 4 (verify steps up to 3 tokens): 297.0 MiB; D = 1 (no rewind): 74.2 MiB" in out
    code, out, _ = run_cli(capsys, "--model", "qwen3-next-80b-a3b", "--context", "32k", "--json")
    data = json.loads(out)
    per_slot = 36 * gated_deltanet_bytes(16, 128, 32, 128, 4)
    assert data["state"] == {"slots": 9, "dtype": "bfloat16", "bytes_per_slot": per_slot,
                             "total_bytes": 9 * per_slot, "one_slot_total_bytes": per_slot}


def test_cli_shared_and_chunked_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--model", "gemma-3n-e4b")
    assert code == 0
    assert "16 sliding + 4 full + 15 shared" in out
    assert "read layers 18, 19's K/V" in out
    code, out, _ = run_cli(capsys, "--model", "llama-4-scout", "--context", "128k")
    assert "36 chunked + 12 full" in out and "c8192" in out


def test_cli_state_options_on_a_model_without_state(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--model", "gemma-3-1b", "--state-slots", "4")
    assert code == 0
    assert "--state-slots and --state-dtype apply to recurrent-state layers only" in out


@pytest.mark.parametrize(("slots", "message"), [("0", "'0': must be >= 1"), ("-1", "'-1': must be >= 1"),
                                               ("two", "'two': must be a whole number")])
def test_cli_bad_state_slots_exit_2(capsys: pytest.CaptureFixture[str], slots: str, message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["memory", "--model", "lfm2-1.2b", "--state-slots", slots])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"kvcore memory: error: argument --state-slots: {message}; see kvcore memory --help\n"


@pytest.mark.parametrize("model", ["qwen3-next-80b-a3b", "gemma-3n-e4b"])
def test_docs_state_and_shared_examples_are_the_commands_output(capsys: pytest.CaptureFixture[str], model: str) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "memory.md").read_text(encoding="utf-8")
    start = doc.index(f"$ kvcore memory --model {model} ")
    command, _, rest = doc[start:].partition("\n")
    shown = rest[: rest.index("```")]
    code = main(command.split()[2:])  # "$ kvcore memory ...": the arguments after "kvcore"
    assert code == 0 and capsys.readouterr().out == shown
