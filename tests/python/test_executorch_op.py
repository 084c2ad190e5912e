"""kvcore's caches behind ExecuTorch's ``kvcache::update_and_attend`` op.

1. ExecuTorch's own suite (``executorch/extension/llm/cache/test_update_and_attend.py``
   from the executorch 1.5.1 wheel) runs with ``KVCoreContiguousCache`` and
   ``KVCoreCellCache`` in place of its two reference caches: each of its TestCase
   classes is subclassed here with the module's ``ContiguousReferenceCache`` /
   ``CellReferenceCache`` patched to kvcore's for the duration of each test. Every
   test passes but those in ``EXCLUDED``, each skipped with its reason; the set is
   checked both ways (each excluded test still fails against kvcore and passes against
   the reference, and every other one runs), so it cannot rot silently.
2. ``torch.export`` of a model calling the op, with a kvcore cache installed and active,
   and its eager run equal to the same run on the reference cache (float32, 1e-5):
   prefill, chunked prefill, decode, a ring layer past its window; several sequences in
   one forward (tokens interleaved), a fork and ``seq_rm``.
3. What kvcore does where the excluded tests pin the reference: the cheaper spec kinds
   attend to the same output, the ring's shorter history gives the same attention.
4. The snippet of docs/executorch.md runs as pasted.
"""

from __future__ import annotations

import re
import unittest
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from needs import need

torch = need("torch", reason="the ExecuTorch integration needs torch")
et_tests = need(
    "executorch.extension.llm.cache.test_update_and_attend",
    reason="ExecuTorch's update_and_attend op and its suite need executorch==1.5.1 (installed with --no-deps) "
    "and ruamel.yaml, flatbuffers, tabulate (scripts/test.sh installs them)",
)

import kvcore  # noqa: E402
from kvcore.integrations.executorch import (  # noqa: E402
    KVCoreCellCache,
    KVCoreContiguousCache,
    MAX_SEQS,
    installed,
)

ref = et_tests  # its names: CacheConfig, LayerPolicy, MaskKind, attend, ... (imported from reference_cache)
REGISTRY = et_tests.REGISTRY
update_and_attend = et_tests.update_and_attend

# pytest turns warnings into errors: ExecuTorch marks its cache API experimental with a warning,
# and torch.export in torch 2.13 warns about its own use of pytree's LeafSpec.
pytestmark = [
    pytest.mark.filterwarnings("ignore::executorch.exir._warnings.ExperimentalWarning"),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]

TOL = 1e-5
DOCS = Path(__file__).resolve().parents[2] / "docs" / "executorch.md"



# --- 1. ExecuTorch's suite against kvcore ------------------------------------------------

ET_CLASSES = ("UpdateAndAttendTest", "CellCacheTest", "ContiguousSpecTest", "WindowedSpecTest", "AttendExplicitTest")

#: ExecuTorch tests that pin the reference's own layout or spec kind, with the reason
#: (docs/executorch.md lists the same). Each still fails against kvcore: see
#: test_each_exclusion_fails_against_kvcore_and_passes_against_the_reference.
EXCLUDED: dict[tuple[str, str], str] = {
    ("WindowedSpecTest", "test_window_equal_to_history_stays_fused"): (
        "spec kind improved: one token past the window a kvcore ring layer returns exactly the window, "
        "which the decode's one query sees whole, so the spec is NONE; the reference keeps the whole "
        "history and must mask it (EXPLICIT)"
    ),
    ("WindowedSpecTest", "test_windowed_continuation_bounds_the_band_at_both_ends"): (
        "layout: it pins a mask over the ring layer's whole 7-position history; a kvcore ring layer "
        "returns the window - 1 + T = 4 positions the step's queries can see, with the same band over them"
    ),
    ("CellCacheTest", "test_freeing_the_tail_shrinks_the_read_window"): (
        "spec kind improved: the one new token sees the one live row, so the spec is NONE and has no mask "
        "to read the shape of (the history of 1 row it pins holds)"
    ),
    ("CellCacheTest", "test_layers_can_window_independently"): (
        "spec kind improved: a fresh 4-token prefill on the flat layer is exactly torch's is_causal, so its "
        "spec is CAUSAL with no mask to compare (the windowed layer's EXPLICIT band it pins holds)"
    ),
}


class _OnKVCore:
    """Mixin: for each test, ExecuTorch's test module sees kvcore's caches under the reference names."""

    def setUp(self) -> None:
        patcher = mock.patch.multiple(
            et_tests, ContiguousReferenceCache=KVCoreContiguousCache, CellReferenceCache=KVCoreCellCache
        )
        patcher.start()
        self.addCleanup(patcher.stop)  # type: ignore[attr-defined]
        super().setUp()  # type: ignore[misc]


def _on_kvcore(name: str) -> type:
    base = getattr(et_tests, name)
    skips = {test: unittest.skip(reason)(getattr(base, test)) for (cls, test), reason in EXCLUDED.items() if cls == name}
    return type(f"Test{name}OnKVCore", (_OnKVCore, base), skips)


TestUpdateAndAttendOnKVCore = _on_kvcore("UpdateAndAttendTest")
TestCellCacheOnKVCore = _on_kvcore("CellCacheTest")
TestContiguousSpecOnKVCore = _on_kvcore("ContiguousSpecTest")
TestWindowedSpecOnKVCore = _on_kvcore("WindowedSpecTest")
TestAttendExplicitOnKVCore = _on_kvcore("AttendExplicitTest")


def test_every_executorch_test_class_runs_against_kvcore() -> None:
    found = {n for n, c in vars(et_tests).items() if isinstance(c, type) and issubclass(c, unittest.TestCase)}
    assert found == set(ET_CLASSES)


def test_every_exclusion_names_an_executorch_test() -> None:
    for cls, test in EXCLUDED:
        assert callable(getattr(getattr(et_tests, cls), test, None)), (cls, test)


def test_the_docs_list_exactly_the_exclusions() -> None:
    listed = set(re.findall(r"^\| `(\w+)\.(\w+)` \|", DOCS.read_text(), flags=re.M))
    assert listed == set(EXCLUDED)


@pytest.mark.parametrize("cls, test", sorted(EXCLUDED))
def test_each_exclusion_fails_against_kvcore_and_passes_against_the_reference(cls: str, test: str) -> None:
    # Against kvcore: it must fail (else its exclusion is stale: drop it).
    result = unittest.TestResult()
    type("Probe", (_OnKVCore, getattr(et_tests, cls)), {})(test).run(result)
    assert result.testsRun == 1 and (result.failures or result.errors), f"{cls}.{test} passes on kvcore now"
    # Against the reference it passes: the test is sound, what it pins is the reference's.
    result = unittest.TestResult()
    getattr(et_tests, cls)(test).run(result)
    assert result.wasSuccessful(), result.failures + result.errors


# --- 2. torch.export, then the eager run equal to the reference's -----------------------

N_LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 3, 32, 4, 2, 8, 40
WINDOW = 4
POLICIES = [ref.LayerPolicy.ring(WINDOW), ref.LayerPolicy.flat(), ref.LayerPolicy.ring(WINDOW)]


def et_config(capacity: int, sizing: Any = None, layers: Any = None) -> Any:
    return ref.CacheConfig(
        n_layers=N_LAYERS,
        n_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        capacity=capacity,
        sizing=ref.CacheSizing.DYNAMIC if sizing is None else sizing,
        layers=POLICIES if layers is None else layers,
    )


@pytest.fixture(scope="module")
def model() -> Any:
    torch.manual_seed(0)
    return et_tests.TinyAttentionModel(N_LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, VOCAB).eval()


@pytest.fixture(scope="module")
def exported(model: Any) -> Any:
    """The model exported once with a kvcore cache installed and active, any token count."""
    cache = KVCoreContiguousCache(et_config(64), max_step=4)
    T = torch.export.Dim("T", min=1, max=64)
    x, pos, idx = torch.randn(1, 5, HIDDEN), torch.arange(5).unsqueeze(-1), torch.arange(5)
    with installed(cache):
        ep = torch.export.export(
            model,
            (x, pos, idx),
            dynamic_shapes={"x": {1: T}, "position": {0: T}, "logits_indices": {0: torch.export.Dim("L", max=64)}},
            strict=True,
        ).run_decompositions({})
    assert cache.length == 0 and cache.nbytes() == 0  # tracing ran the fake kernel only
    return ep


def test_export_calls_the_op_per_layer_and_holds_no_cache_state(exported: Any) -> None:
    calls = [n for n in exported.graph_module.graph.nodes if n.target is torch.ops.kvcache.update_and_attend.default]
    assert len(calls) == N_LAYERS
    assert not [s for s in exported.graph_signature.input_specs if s.kind.name == "BUFFER"]


def run(ep: Any, cache: Any, x: Any, positions: list[int], seqs: Any = None) -> Any:
    """One forward of ``x`` at ``positions`` with ``cache`` active (begin_step(seqs) first for a cell cache)."""
    if seqs is not None:
        cache.begin_step(seqs)
    REGISTRY.install("test_executorch_op", cache)
    try:
        with REGISTRY.active("test_executorch_op"), torch.no_grad():
            return ep.module()(x, torch.tensor(positions).unsqueeze(-1), torch.arange(x.shape[1]))
    finally:
        REGISTRY.uninstall("test_executorch_op")


def assert_same(a: Any, b: Any) -> None:
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= TOL


@pytest.mark.parametrize(
    "sizing, options",
    [
        ("DYNAMIC", {}),
        ("STATIC", {}),
        ("DYNAMIC", {"mirror_rings": False}),  # a wrapped window gathered
        ("STATIC", {"mirror_rings": False, "order": "rows"}),  # the held rows as they lie, masked
    ],
)
def test_one_sequence_equals_the_reference(exported: Any, sizing: str, options: dict[str, Any]) -> None:
    # Chunked prefill of 6 (3 + 3), decode to 14: ring layers (window 4, max_step 4: 7 rows) wrap.
    torch.manual_seed(1)
    x = torch.randn(1, 14, HIDDEN)
    mode = getattr(ref.CacheSizing, sizing)
    reference = ref.ContiguousReferenceCache(et_config(16, mode))
    cache = KVCoreContiguousCache(et_config(16, mode), max_step=4, **options)
    steps = [(0, 3), (3, 3)] + [(p, 1) for p in range(6, 12)] + [(12, 2)]
    for start, T in steps:
        pos = list(range(start, start + T))
        assert_same(run(exported, cache, x[:, start : start + T], pos), run(exported, reference, x[:, start : start + T], pos))
    assert cache.length == 14
    assert cache.rows(0) == WINDOW + 4 - 1 and cache.rows(1) == 16


def test_rewound_drafts_leave_no_trace(exported: Any) -> None:
    # Speculative decoding past the ring's wrap: three drafts verified in one forward, two
    # rejected (rewind), then decoding goes on as if only the accepted one had been fed.
    torch.manual_seed(6)
    x, drafts = torch.randn(1, 12, HIDDEN), torch.randn(1, 3, HIDDEN)
    cache = KVCoreContiguousCache(et_config(32), max_step=4)
    reference = ref.ContiguousReferenceCache(et_config(32))
    for start in range(0, 10, 2):
        run(exported, cache, x[:, start : start + 2], [start, start + 1])
        run(exported, reference, x[:, start : start + 2], [start, start + 1])
    run(exported, cache, drafts, [10, 11, 12])
    assert cache.can_rewind(11) and not cache.can_rewind(13 - 4 - 1)
    cache.rewind(11)
    run(exported, reference, drafts[:, :1], [10])
    assert_same(run(exported, cache, x[:, 11:12], [11]), run(exported, reference, x[:, 11:12], [11]))


def test_one_sequence_prefill_equals_the_cacheless_model(exported: Any, model: Any) -> None:
    torch.manual_seed(2)
    x = torch.randn(1, 4, HIDDEN)
    cache = KVCoreContiguousCache(et_config(8, layers=[ref.LayerPolicy.flat()]))
    out = run(exported, cache, x, [0, 1, 2, 3])
    with torch.no_grad():
        assert float((out - model.reference_forward(x, torch.arange(4))).abs().max()) <= 1e-4


@pytest.mark.parametrize("block_size", [1, 4])  # 4: the fork shares a partly filled block, copied on write
def test_many_sequences_with_a_fork_and_seq_rm_equal_the_reference(exported: Any, block_size: int) -> None:
    torch.manual_seed(3)
    reference = ref.CellReferenceCache(et_config(48))
    cache = KVCoreCellCache(et_config(48), max_step=4, block_size=block_size)  # rings release what no window needs
    caches = (cache, reference)

    def both(x: Any, positions: list[int], seqs: list[int]) -> None:
        assert_same(run(exported, cache, x, positions, seqs), run(exported, reference, x, positions, seqs))

    both(torch.randn(1, 7, HIDDEN), [0, 1, 2, 3, 0, 1, 2], [0, 0, 0, 0, 1, 1, 1])  # two prefills in one forward
    both(torch.randn(1, 4, HIDDEN), [3, 4, 4, 5], [1, 0, 1, 0])  # interleaved tokens of both
    for c in caches:
        c.seq_cp(0, 2, upto=5)  # a fork sharing positions 0..4
    both(torch.randn(1, 3, HIDDEN), [5, 5, 6], [2, 1, 0])
    for c in caches:
        c.seq_rm(1, 5)  # truncate sequence 1 at 5 (within a max_step rewind)
        c.seq_rm(0, 0, 2)  # drop sequence 0's oldest two
    assert [cache.seq_len(s) for s in range(3)] == [reference.seq_len(s) for s in range(3)] == [5, 5, 6]
    for p in range(3):  # decode every sequence, past the windows
        both(torch.randn(1, 3, HIDDEN), [7 + p, 5 + p, 6 + p], [0, 1, 2])
    for c in caches:
        c.seq_rm(2)
    both(torch.randn(1, 2, HIDDEN), [10, 8], [0, 1])
    if block_size == 1:
        assert cache.free_cells() == reference.free_cells()  # flat layer: the same cells held
        in_use = [cache.cache.held_blocks(g) for g in (0, 1)]
        assert cache.cache.group_of(0) == 0 and in_use[0] < in_use[1] == 48 - reference.free_cells()  # ring released


def test_a_fork_copies_its_shared_block_once_per_group() -> None:
    # block_size 4: sequence 1 forks 0..5 of sequence 0, sharing the partly filled block 1 (rows 4..7),
    # which its first write copies. Admission (begin_step) only checks that the step fits: the copy is
    # the forward's, once per group.
    cache = KVCoreCellCache(et_config(32), max_step=8, block_size=4)
    kv = torch.randn(1, KV_HEADS, 6, HEAD_DIM)
    cache.begin_step([0] * 6)
    for layer in range(N_LAYERS):
        cache.update_and_fetch(layer, kv, kv, torch.arange(6)[:, None])
    cache.seq_cp(0, 1)
    copied: list[tuple[int, int]] = []  # (group, blocks copied)
    real = cache.storage.copy_blocks

    def spy(group: int, copies: Any) -> None:
        copied.extend([(group, len(copies))] if len(copies) else [])
        real(group, copies)

    one = torch.randn(1, KV_HEADS, 1, HEAD_DIM)
    with mock.patch.object(cache.storage, "copy_blocks", spy):
        cache.begin_step([1])
        for layer in range(N_LAYERS):
            cache.update_and_fetch(layer, one, one, torch.tensor([[6]]))
    assert sorted(copied) == [(g, 1) for g in range(cache.cache.n_groups)]


def test_cell_positions_must_continue_each_sequence() -> None:
    cache = KVCoreCellCache(et_config(16))
    kv = torch.randn(1, KV_HEADS, 2, HEAD_DIM)
    cache.begin_step([0, 0])
    cache.update_and_fetch(0, kv, kv, torch.tensor([[0], [1]]))
    cache.begin_step([0, 3])
    with pytest.raises(ValueError, match="sequence 0: its 1 tokens are at positions \\[5\\], but they must be 2..2"):
        cache.update_and_fetch(0, kv, kv, torch.tensor([[5], [0]]))
    assert cache.seq_len(0) == 2 and cache.seq_len(3) == 0 and cache.free_cells() == 14  # nothing changed
    with pytest.raises(RuntimeError):  # the declaration is spent
        cache.update_and_fetch(0, kv, kv, torch.tensor([[2], [0]]))


def test_contiguous_positions_must_continue_the_sequence() -> None:
    cache = KVCoreContiguousCache(et_config(16))
    kv = torch.randn(1, KV_HEADS, 2, HEAD_DIM)
    with pytest.raises(ValueError, match="must be 0..1"):
        cache.update_and_fetch(0, kv, kv, torch.tensor([[3], [4]]))
    for layer in range(N_LAYERS):
        cache.update_and_fetch(layer, kv, kv, torch.tensor([[0], [1]]))
    assert cache.length == 2
    with pytest.raises(RuntimeError, match="no forward is under way"):
        cache.update_and_fetch(1, kv, kv, torch.tensor([[2], [3]]))
    cache.update_and_fetch(0, kv, kv, torch.tensor([[2], [3]]))
    cache.update_and_fetch(1, kv, kv, torch.tensor([[2], [3]]))
    with pytest.raises(RuntimeError, match="served twice"):
        cache.update_and_fetch(1, kv, kv, torch.tensor([[2], [3]]))
    kv4 = torch.randn(1, KV_HEADS, 4, HEAD_DIM)
    with pytest.raises(RuntimeError, match="exceeds capacity 3"):  # as the reference raises
        KVCoreContiguousCache(et_config(3)).update_and_fetch(0, kv4, kv4, torch.arange(4)[:, None])


# --- 3. Where kvcore differs from what the excluded tests pin ------------------------------


def attend(q: Any, spec_out: tuple[Any, Any, Any]) -> Any:
    k, v, spec = spec_out
    return ref.attend(q, k, v, spec, HEAD_DIM**-0.5, torch.float32)


def test_ring_decode_and_continuation_attend_as_the_reference() -> None:
    torch.manual_seed(4)
    layers = [ref.LayerPolicy.ring(2)]
    cfg = lambda: ref.CacheConfig(n_layers=1, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, capacity=32, layers=layers)  # noqa: E731
    reference, cache = ref.ContiguousReferenceCache(cfg()), KVCoreContiguousCache(cfg(), max_step=4)
    for start, T, kind in [(0, 4, "EXPLICIT"), (4, 3, "EXPLICIT"), (7, 1, "NONE"), (8, 1, "NONE")]:
        kv, q = torch.randn(1, KV_HEADS, T, HEAD_DIM), torch.randn(1, HEADS, T, HEAD_DIM)
        pos = torch.arange(start, start + T)[:, None]
        mine, theirs = cache.update_and_fetch(0, kv, kv, pos), reference.update_and_fetch(0, kv, kv, pos)
        assert mine[2].kind is getattr(ref.MaskKind, kind)
        assert mine[0].shape[2] == min(start + T, 2 - 1 + T)  # the window's keys, not the whole history
        assert_same(attend(q, mine), attend(q, theirs))


def test_a_flat_cell_cache_returns_causal_and_none_masks() -> None:
    torch.manual_seed(6)
    cfg = lambda: et_config(32, layers=[ref.LayerPolicy.flat()])  # noqa: E731
    reference, cache = ref.CellReferenceCache(cfg()), KVCoreCellCache(cfg())
    for positions, kind in [([0, 1, 2, 3], "CAUSAL"), ([4], "NONE")]:  # a fresh prefill, then a decode
        T = len(positions)
        kv, q = torch.randn(1, KV_HEADS, T, HEAD_DIM), torch.randn(1, HEADS, T, HEAD_DIM)
        pos = torch.tensor(positions)[:, None]
        for c in (cache, reference):
            c.begin_step([0] * T)
        for layer in range(2):
            mine, theirs = cache.update_and_fetch(layer, kv, kv, pos), reference.update_and_fetch(layer, kv, kv, pos)
            assert_same(attend(q, mine), attend(q, theirs))
            assert mine[2].kind is getattr(ref.MaskKind, kind), (positions, layer)


def test_cell_kinds_attend_as_the_reference() -> None:
    torch.manual_seed(5)
    cfg = lambda: et_config(32, layers=[ref.LayerPolicy.flat(), ref.LayerPolicy.ring(2), ref.LayerPolicy.flat()])  # noqa: E731
    reference, cache = ref.CellReferenceCache(cfg()), KVCoreCellCache(cfg())
    # The flat and ring groups draw their cells from one pool (docs/batch.md section 5), so a
    # layer's live rows interleave its group's cells with the other group's: no history here is
    # the step's own tokens alone (CAUSAL) or all visible (NONE); a flat-only cache keeps those
    # kinds (test_a_flat_cell_cache_returns_causal_and_none_masks).
    for positions, seqs, kinds in [
        ([0, 1, 2, 3], [0] * 4, ("EXPLICIT", "EXPLICIT")),  # fresh prefill: causal flat, banded ring
        ([4], [0], ("EXPLICIT", "EXPLICIT")),  # a decode sees its live rows (flat), the last 2 of 5 (ring)
        ([0, 5], [1, 0], ("EXPLICIT", "EXPLICIT")),  # two sequences: neither sees the other's rows
    ]:
        T = len(seqs)
        kv, q = torch.randn(1, KV_HEADS, T, HEAD_DIM), torch.randn(1, HEADS, T, HEAD_DIM)
        pos = torch.tensor(positions)[:, None]
        for c in (cache, reference):
            c.begin_step(seqs)
        for layer in range(2):
            mine, theirs = cache.update_and_fetch(layer, kv, kv, pos), reference.update_and_fetch(layer, kv, kv, pos)
            assert_same(attend(q, mine), attend(q, theirs))
            assert mine[2].kind is getattr(ref.MaskKind, kinds[layer]), (positions, layer)


# --- 4. The docs -------------------------------------------------------------------------------


def test_the_docs_snippet_runs() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", DOCS.read_text(), flags=re.S | re.M)
    assert blocks, "docs/executorch.md has no Python block"
    scope: dict[str, Any] = {}
    exec(blocks[0], scope)


def test_installed_puts_the_kvcore_cache_in_both_registries() -> None:
    cache = KVCoreCellCache(et_config(8))
    with installed(cache, "etop-key") as key:
        assert key == "etop-key"
        assert REGISTRY.current() is cache
        assert kvcore.registry.find(key, kvcore.BatchCache) is cache.kvcore
    assert not kvcore.registry.contains("etop-key")
    with pytest.raises(RuntimeError):
        REGISTRY.current()


def test_installed_under_a_taken_key_leaves_executorch_registry_without_the_cache() -> None:
    # kvcore's registry is filled first: a key taken there fails before ExecuTorch's REGISTRY sees the cache.
    holder = KVCoreCellCache(et_config(8))
    cache = KVCoreCellCache(et_config(8))
    kvcore.registry.install("etop-taken", holder.kvcore)
    try:
        with pytest.raises(kvcore.AlreadyRegisteredError):
            with installed(cache, "etop-taken"):
                pass
        with pytest.raises(KeyError, match="no cache installed"), REGISTRY.active("etop-taken"):
            pass
        assert kvcore.registry.find("etop-taken") is holder.kvcore
    finally:
        kvcore.registry.erase("etop-taken")
        REGISTRY.uninstall("etop-taken")  # only if the test fails: a leaked entry must not reach other tests


def test_installed_without_a_key_reserves_a_fresh_one() -> None:
    cache = KVCoreCellCache(et_config(8))
    with installed(cache) as key:
        assert key.startswith("executorch#")
        assert REGISTRY.current() is cache and kvcore.registry.find(key) is cache.kvcore
    assert not kvcore.registry.contains(key)


@pytest.mark.parametrize("make", [KVCoreContiguousCache, KVCoreCellCache])
def test_a_value_head_dim_of_its_own(make: Any) -> None:
    # The op allows v's head dim to differ from k's (MLA); ExecuTorch's CacheConfig has one head_dim.
    cache = make(ref.CacheConfig(n_layers=1, n_kv_heads=2, head_dim=8, capacity=16), v_head_dim=5)
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 5)
    if isinstance(cache, KVCoreCellCache):
        cache.begin_step([0, 0, 0])
    with installed(cache):
        out = update_and_attend(q, k, v, torch.arange(3)[:, None], 0, 0.25, torch.float32)
    assert out.shape == (1, 4, 3, 5)


def test_the_documented_errors_of_rows_seq_len_and_update_and_fetch() -> None:
    contiguous = KVCoreContiguousCache(et_config(16), max_step=4)
    assert contiguous.max_step == 4 and contiguous.rows(0) == WINDOW + 4 - 1 and contiguous.rows(1) == 16
    with pytest.raises(ValueError, match="layer = 3"):
        contiguous.rows(N_LAYERS)
    kv = torch.randn(1, KV_HEADS, 5, HEAD_DIM)
    with pytest.raises(ValueError, match="must be <= max_step = 4"):
        contiguous.update_and_fetch(0, kv, kv, torch.arange(5)[:, None])
    with pytest.raises(RuntimeError, match="no forward is under way"):
        contiguous.update_and_fetch(1, kv, kv, torch.arange(5)[:, None])
    cell = KVCoreCellCache(et_config(16))
    with pytest.raises(ValueError, match="seq_id 63 outside"):
        cell.seq_len(MAX_SEQS)
    one = torch.randn(1, KV_HEADS, 1, HEAD_DIM)
    with pytest.raises(RuntimeError, match="no step declared"):
        cell.update_and_fetch(0, one, one, torch.tensor([[0]]))
    cell.begin_step([0])
    with pytest.raises(NotImplementedError, match="one position per token"):
        cell.update_and_fetch(0, one, one, torch.tensor([[0, 0]]))


def test_cell_cache_defaults_accept_the_references_sequence_ids() -> None:
    cache = KVCoreCellCache(et_config(8))
    assert cache.max_seqs == MAX_SEQS == 63
    assert cache.seq_len(MAX_SEQS - 1) == 0
    assert KVCoreCellCache(et_config(8), max_seqs=1000).seq_len(999) == 0


def test_cell_cache_bounds_the_sequences_active_at_once() -> None:
    """``max_active_seqs`` (default 16) sizes kvcore's block tables: one more active sequence
    is a CapacityError that changes nothing; ``seq_rm`` emptying a sequence frees its row."""
    assert KVCoreCellCache(et_config(8)).kvcore.max_active_seqs == 16
    assert KVCoreCellCache(et_config(8), max_seqs=4).kvcore.max_active_seqs == 4
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"max_active_seqs = {bad}: must be >= 1"):
            KVCoreCellCache(et_config(8), max_active_seqs=bad)
    cache = KVCoreCellCache(et_config(16), max_active_seqs=2)
    kv = torch.randn(1, KV_HEADS, 2, HEAD_DIM)
    cache.begin_step([0, 5])
    cache.update_and_fetch(0, kv, kv, torch.tensor([[0], [0]]))
    with pytest.raises(kvcore.CapacityError, match="add_sequences: 2 sequences would become active, 0 table rows"):
        cache.begin_step([7, 0, 9])
    with pytest.raises(RuntimeError, match="fork\\(9\\): 2 sequences are active"):
        cache.seq_cp(0, 9)
    assert [cache.seq_len(s) for s in (0, 5, 7, 9)] == [1, 1, 0, 0]
    assert not cache.kvcore.sequence(7).active and cache.kvcore.free_table_rows == 0
    cache.seq_rm(5)  # empties 5: its row goes back
    assert cache.kvcore.free_table_rows == 1
    cache.seq_cp(0, 9)
    assert cache.seq_len(9) == 1


def test_the_benchmark_runs_and_its_caches_agree(tmp_path: Path) -> None:
    # A smoke run of bench/executorch_compare.py (it checks every cache's attention agrees
    # before timing and exits otherwise), so the benchmark cannot rot. No timing is asserted.
    import importlib.util
    import json

    path = Path(__file__).resolve().parents[2] / "bench" / "executorch_compare.py"
    spec = importlib.util.spec_from_file_location("executorch_compare", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "out.json"
    assert bench.main(["--contexts", "80", "--reps", "2", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["context"], r["sequences"]) for r in results] == [(80, 1), (80, 16)]
    assert all(r["max_abs_diff"] <= 1e-4 for r in results)


# --- 5. A failed forward changes nothing (kvcore.forward_step) -----------------


def cell_state(cache: KVCoreCellCache, seqs: range) -> Any:
    """What a failed forward must leave as it was: every sequence's info, length and blocks, the free counts."""
    kv = cache.cache
    return ([repr(kv.sequence(s)) for s in seqs], [cache.seq_len(s) for s in seqs],
            [[kv.blocks_held(s, g) for g in range(kv.n_groups)] for s in seqs if kv.sequence(s).active],
            [kv.free_blocks(g) for g in range(kv.n_groups)])


@pytest.mark.parametrize("block_size", [1, 4])
@pytest.mark.parametrize("bad", ["heads", "head_dim", "tokens"])
def test_a_bad_first_layer_leaves_the_cell_cache_as_it_was(block_size: int, bad: str) -> None:
    # Was: the first layer's placement committed before its K/V were checked, so the lengths
    # grew over rows never written.
    cache = KVCoreCellCache(et_config(32), max_step=8, block_size=block_size)
    kv = torch.randn(1, KV_HEADS, 3, HEAD_DIM)
    cache.begin_step([0, 0, 0])
    for layer in range(N_LAYERS):
        cache.update_and_fetch(layer, kv, kv, torch.arange(3)[:, None])
    before = cell_state(cache, range(3))
    shape = {"heads": (1, KV_HEADS + 1, 2, HEAD_DIM), "head_dim": (1, KV_HEADS, 2, HEAD_DIM + 2),
             "tokens": (1, KV_HEADS, 3, HEAD_DIM)}[bad]
    cache.begin_step([0, 1])  # sequence 1 is new: the step adds it
    with pytest.raises(ValueError, match="layer 1: key"):
        cache.update_and_fetch(1, torch.randn(*shape), torch.randn(*shape), torch.tensor([[3], [0]]))
    assert cell_state(cache, range(3)) == before
    with pytest.raises(RuntimeError, match="no step declared"):  # the declaration is spent, as the reference's
        cache.update_and_fetch(0, kv[:, :, :2], kv[:, :, :2], torch.tensor([[3], [0]]))
    # The next step goes on exactly as on a cache that never saw the bad one.
    twin = KVCoreCellCache(et_config(32), max_step=8, block_size=block_size)
    twin.begin_step([0, 0, 0])
    for layer in range(N_LAYERS):
        twin.update_and_fetch(layer, kv, kv, torch.arange(3)[:, None])
    two = torch.randn(1, KV_HEADS, 2, HEAD_DIM)
    for c in (cache, twin):
        c.begin_step([0, 1])
    for layer in range(N_LAYERS):
        got, want = (c.update_and_fetch(layer, two, two, torch.tensor([[3], [0]])) for c in (cache, twin))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert cache.seq_len(0) == 4 and cache.seq_len(1) == 1


def test_a_refused_seq_cp_leaves_dst_as_it_was() -> None:
    # Was: seq_cp released a dst that saw nothing before kvcore's fork refused, so dst lost its length.
    cache = KVCoreCellCache(et_config(32), max_step=4)
    for seq, n in ((0, 12), (1, 3)):
        for start in range(0, n, 4):
            T = min(4, n - start)
            kv = torch.randn(1, KV_HEADS, T, HEAD_DIM)
            cache.begin_step([seq] * T)
            for layer in range(N_LAYERS):
                cache.update_and_fetch(layer, kv, kv, torch.arange(start, start + T)[:, None])
    cache.seq_rm(1, 0, 2)
    cache.seq_rm(1, 2)  # sequence 1: length 2, sees nothing
    before = cell_state(cache, range(2))
    assert cache.cache.sequence(1).length == 2 and cache.seq_len(1) == 0
    # A query at 1 needs position 0, which sequence 0's ring layers released long ago.
    with pytest.raises(RuntimeError, match=r"seq_cp\(0, 1, upto = 1\): a ring layer of sequence 0 no longer holds"):
        cache.seq_cp(0, 1, upto=1)
    assert cell_state(cache, range(2)) == before
    cache.seq_cp(0, 1)  # the whole of sequence 0 is held: dst goes, and the fork shares it
    assert cache.seq_len(1) == 12


def test_a_bad_later_layer_aborts_the_contiguous_forward() -> None:
    cache = KVCoreContiguousCache(et_config(32), max_step=4)
    kv = torch.randn(1, KV_HEADS, 2, HEAD_DIM)
    for layer in range(N_LAYERS):
        cache.update_and_fetch(layer, kv, kv, torch.tensor([[0], [1]]))
    rewindable = [cache.can_rewind(n) for n in range(3)]
    cache.update_and_fetch(0, kv, kv, torch.tensor([[2], [3]]))
    bad = torch.randn(1, KV_HEADS + 1, 2, HEAD_DIM)
    with pytest.raises(ValueError, match="layer 1"):
        cache.update_and_fetch(1, bad, bad, torch.tensor([[2], [3]]))
    # The step is aborted, not left begun: the length, the begun step and the rewinds are as before.
    assert cache.length == 2 and cache.sequence.active_step is None
    assert [cache.can_rewind(n) for n in range(3)] == rewindable
    with pytest.raises(RuntimeError, match="no forward is under way"):
        cache.update_and_fetch(1, kv, kv, torch.tensor([[2], [3]]))
    for layer in range(N_LAYERS):  # the forward again, from layer 0
        cache.update_and_fetch(layer, kv, kv, torch.tensor([[2], [3]]))
    assert cache.length == 4
