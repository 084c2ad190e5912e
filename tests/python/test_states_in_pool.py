"""State groups that take their slots from the one pool (BatchLimits.states_in_pool;
docs/batch.md section 10, "States in the pool"): a state costs a block of the budget only
while someone needs it, a named snapshot is a cached block, a step the pool cannot serve is
refused whole, and the byte layers that keep states apart refuse such a cache by name. The
C++ brute-force walk (BatchStateBruteForce.StatesInThePool...) holds every state read to the
model on random workloads."""

from __future__ import annotations

import numpy as np
import pytest

import kvcore

B = 4


def hybrid(num_blocks: int = 64, snapshots: int = 1, page_layers: int = 0, states: int = 2) -> kvcore.BatchCache:
    """A Flat layer between State(1) layers (Qwen3-Next's order, small), states in the pool."""
    layers = [kvcore.LayerConfig(kvcore.State(1))] * states + [kvcore.LayerConfig(kvcore.Flat(), 1, 4)]
    limits = kvcore.BatchLimits(
        block_size=B, max_seqs=4, num_blocks=num_blocks, state_snapshots=snapshots, page_layers=page_layers,
        states_in_pool=True,
    )
    return kvcore.BatchCache(kvcore.CacheConfig(64, layers, max_step=8, batch=limits))


def prefill(c: kvcore.BatchCache, seq: int, tokens: list[int]) -> None:
    c.add_sequence(seq)
    for at in range(0, len(tokens), B):  # chunks ending on block boundaries: each names a snapshot
        chunk = tokens[at : at + B]
        c.step([(seq, len(chunk), chunk)]).commit()


def test_state_layers_form_groups_of_page_layers_whose_states_live_in_the_flat_layers_pages() -> None:
    c = hybrid(page_layers=1)
    assert (c.n_groups, c.n_state_groups) == (1, 2)  # one State group per layer, as the flat group's size
    assert [c.state_group_of(layer) for layer in (0, 1)] == [0, 1]
    assert c.storage_layer(0) == 2  # the first State group's layer keeps its states in the flat layer's pages
    assert c.storage_layer(1) == 2
    assert c.num_state_slots(0) == c.num_blocks(0) == 64  # a physical state slot is a block of the pool
    # Without page_layers the fewest layers of any policy decide (vLLM's rule): 1 flat layer, so 1.
    assert hybrid().n_state_groups == 2
    # Without states in the pool the State layers of one policy stay one group with slots of its own.
    layers = [kvcore.LayerConfig(kvcore.State(1))] * 2 + [kvcore.LayerConfig(kvcore.Flat(), 1, 4)]
    apart = kvcore.BatchCache(kvcore.CacheConfig(64, layers, max_step=8, batch=kvcore.BatchLimits(block_size=B, max_seqs=4)))
    assert apart.n_state_groups == 1 and apart.storage_layer(0) == 0


def test_a_step_takes_a_block_per_state_it_keeps_as_state_blocks_needed_says() -> None:
    c = hybrid()
    c.add_sequence(0)
    free = c.free_blocks(0)
    assert c.blocks_needed(0, 6) == [2]
    assert c.state_blocks_needed(0, 6) == 2  # the last state, in each of the two State groups
    step = c.begin_step([(0, 6, list(range(6)))])
    assert c.free_blocks(0) == free - 2 - 2
    plan = step.plan()
    writes = [plan.state_groups[k].write_slots.copy() for k in range(2)]  # views: stale once the step ends
    tables = plan.groups[0].block_tables.copy()
    step.commit()
    held_kv = set(tables[tables >= 0].tolist())
    held_states = {int(w[-1]) for w in writes}
    assert len(held_states) == 2 and not held_states & held_kv  # no block is in two places
    # The next step writes the same logical slot in place (D = 1, unnamed): no state block.
    assert c.state_blocks_needed(0, 1) == 0
    with pytest.raises(kvcore.InvalidArgumentError, match=r"verify = 2: must be a bool \(or 0 / 1\)"):
        c.state_blocks_needed(0, 1, verify=2)
    assert c.state_blocks_needed(0, 1, verify=np.bool_(False)) == c.state_blocks_needed(0, 1, verify=0) == 0
    with pytest.raises(kvcore.InvalidArgumentError, match="a verify step keeps every state"):
        c.state_blocks_needed(0, 1, verify=True)  # State(1) keeps one state: T <= D - 1 = 0
    with pytest.raises(kvcore.InvalidArgumentError, match=r"state_blocks_needed\(0, T = 9\): must be in \[1, max_step = 8\]"):
        c.state_blocks_needed(0, 9)
    with pytest.raises(kvcore.CapacityError, match=r"state_blocks_needed\(0, T = 8\): length 60 \+ T would pass capacity = 64"):
        for _ in range(10):
            c.step([(0, 6)]).commit()
            c.state_blocks_needed(0, 8)
    with pytest.raises(kvcore.InvalidStateError, match="state_blocks_needed: sequence 3 is not active"):
        c.state_blocks_needed(3, 1)


def test_a_step_the_pool_cannot_serve_with_its_states_is_refused_whole() -> None:
    c = hybrid(num_blocks=3, snapshots=0)
    c.add_sequence(0)
    assert c.blocks_needed(0, 4) == [1] and c.state_blocks_needed(0, 4) == 2
    c.step([(0, 4, [1, 2, 3, 4])]).commit()  # 1 K/V block and 2 states: the pool's 3
    c.add_sequence(1)
    before = (c.free_blocks(0), c.length(0), c.length(1), c.blocks_held(0, 0), c.can_rewind(0, 4))
    with pytest.raises(kvcore.CapacityError, match=r"needs 3 blocks over its 3 groups \(2 of them for the states of 2 State groups\), 0 of"):
        c.begin_step([(1, 1, [5])])
    assert (c.free_blocks(0), c.length(0), c.length(1), c.blocks_held(0, 0), c.can_rewind(0, 4)) == before
    c.rewind(0, 0)  # a rewind to 0 gives back its K/V block and its states: now sequence 1 fits
    assert c.free_blocks(0) == 3
    c.step([(1, 1, [5])]).commit()
    assert c.length(1) == 1


def test_a_named_snapshot_is_a_cached_block_reused_until_the_pool_needs_it() -> None:
    c = hybrid(num_blocks=12)
    c.enable_kv_events(256)
    prompt = list(range(10, 18))  # two full blocks: snapshots after each
    prefill(c, 0, prompt)
    assert [c.state_snapshots(k) for k in range(2)] == [2, 2]
    c.release_sequence(0)
    # Released, the snapshots stay named as cached blocks: they count as free and serve a hit.
    assert [c.state_snapshots(k) for k in range(2)] == [2, 2]
    assert c.free_blocks(0) == 12
    assert c.lookup_prefix(prompt + [1]) == 8
    c.add_sequence(1)
    assert c.adopt_prefix(1, prompt + [1]) == 8
    step = c.begin_step([(1, 1, [1])])
    reads = [int(step.plan().state_groups[k].read_slots[0]) for k in range(2)]
    step.commit()
    events = c.drain_kv_events()
    stored = events[events["kind"] == kvcore.KV_EVENT_STORED]
    # A State group's events name it as group n_groups + k, with the block its state follows.
    for k in range(2):
        mine = stored[stored["group"] == c.n_groups + k]
        assert [(int(e["start"]), int(e["end"])) for e in mine] == [(0, 4), (4, 8)]
    keys = kvcore.block_keys(prompt, B)
    last = stored[(stored["group"] == c.n_groups) & (stored["start"] == 4)][0]
    assert (int(last["key_lo"]), int(last["key_hi"])) == (int(keys[1][0]), int(keys[1][1]))
    assert len(set(reads)) == 2  # the adopter starts from the two named states
    # Its first step wrote fresh state blocks, and it still holds the two snapshots it adopted
    # (as it holds the prefix's K/V blocks): 3 K/V blocks, 2 states, 2 snapshots of the 12.
    assert c.free_blocks(0) == 12 - 3 - 2 - 2
    c.rewind(1, 0)  # below the prefix it adopted: the snapshots are no longer held (cached)
    assert c.free_blocks(0) == 12
    assert c.lookup_prefix(prompt + [1]) == 8
    # Other prompts fill the pool: the cached snapshots are reclaimed with the other cached
    # blocks, least recently released first, and the prompt no longer hits.
    for seq, base in ((2, 100), (3, 200)):
        prefill(c, seq, list(range(base, base + 12)))
    assert c.lookup_prefix(prompt + [1]) == 0
    evicted = c.drain_kv_events()
    evicted = evicted[evicted["kind"] == kvcore.KV_EVENT_EVICTED]
    assert {int(g) for g in evicted["group"]} >= {c.n_groups, c.n_groups + 1}


def test_a_sequence_holds_the_latest_state_it_named_until_it_names_a_newer_one() -> None:
    c = hybrid(num_blocks=12)
    prefill(c, 0, list(range(10, 18)))  # names the states after blocks 0 and 1
    # 2 K/V blocks and the state after block 1 in each State group; the state after block 0
    # went to the cache (free) when the sequence named a newer one.
    assert c.free_blocks(0) == 12 - 2 - 2
    assert [c.state_snapshots(k) for k in range(2)] == [2, 2]
    c.step([(0, 1, [1])]).commit()  # writes fresh state blocks: the named ones stay held
    assert c.free_blocks(0) == 12 - 3 - 2 - 2
    c.rewind(0, 0)  # below every state it named: nothing held, the names cached
    assert c.free_blocks(0) == 12
    assert c.lookup_prefix(list(range(10, 18)) + [1]) == 8


def test_two_sequences_computing_one_prompt_keep_one_snapshot_of_each_state() -> None:
    # Side by side, in the same steps: each commit fills one K/V block per content (one copy
    # kept) and names the state after it in both State groups; the second sequence's state block
    # is traded for the first's copy, so each name costs one block, not two.
    c = hybrid(num_blocks=32)
    prompt = list(range(10, 18))
    c.add_sequence(0)
    c.add_sequence(1)
    c.step([(0, B, prompt[:B]), (1, B, prompt[:B])]).commit()
    assert c.free_blocks(0) == 32 - 1 - 2  # one K/V block, one state per State group
    assert [c.state_snapshots(k) for k in range(2)] == [1, 1]
    step = c.begin_step([(0, B, prompt[B:]), (1, B, prompt[B:])])
    plan = step.plan()
    for k in range(2):  # both read the one copy, and write fresh blocks of their own (it is named)
        reads = [int(r) for r in plan.state_groups[k].read_slots if r >= 0]
        writes = [int(w) for w in plan.state_groups[k].write_slots if w >= 0]
        assert len(reads) == 2 and reads[0] == reads[1]
        assert len(writes) == 2 and len(set(writes)) == 2 and reads[0] not in writes
    step.commit()
    # Two K/V blocks and the latest named state of each group, held by both; the states after
    # block 0 are cached (named, free).
    assert c.free_blocks(0) == 32 - 2 - 2
    assert [c.state_snapshots(k) for k in range(2)] == [2, 2]
    assert c.lookup_prefix(prompt + [1]) == 8
    c.release_sequence(0)
    c.release_sequence(1)
    assert c.free_blocks(0) == 32 and c.lookup_prefix(prompt + [1]) == 8


def test_release_named_state_frees_the_latest_named_state_which_stays_named_until_reclaimed() -> None:
    c = hybrid(num_blocks=12)
    prompt = list(range(10, 18))
    prefill(c, 0, prompt)  # names the states after blocks 0 and 1, holds the latest
    c.step([(0, 1, [1])]).commit()  # a fresh state block: the named one is held by the hold alone
    held = c.free_blocks(0)
    assert held == 12 - 3 - 2 - 2
    assert c.release_named_state(0) == 2  # one per State group
    assert c.free_blocks(0) == held + 2
    assert c.lookup_prefix(prompt + [1]) == 8  # still named: cached, found by lookups
    assert c.release_named_state(0) == 0  # nothing named held any more
    # An adopted state stays held: sequence 1 adopts the prompt, takes the cached states back.
    c.add_sequence(1)
    assert c.adopt_prefix(1, prompt + [1]) == 8
    assert c.free_blocks(0) == held
    assert c.release_named_state(1) == 0 and c.free_blocks(0) == held
    # The next state a sequence names it holds again; here it is also its live state (written in
    # place: its own block), which its slot holds, so giving the name back frees nothing yet ...
    c.step([(0, 3, [2, 3, 4])]).commit()  # length 12: names the state after block 2
    assert [c.state_snapshots(k) for k in range(2)] == [3, 3]
    free = c.free_blocks(0)
    assert c.release_named_state(0) == 0 and c.free_blocks(0) == free
    # ... and the next write, into fresh state blocks, leaves the named ones to the cache.
    c.step([(0, 1, [5])]).commit()
    assert c.free_blocks(0) == free - 1  # block 3 of K/V; the fresh states took the named ones' place
    assert c.release_named_state(0) == 0
    # Pressure: other prompts fill the pool and reclaim the released states with the cached blocks.
    c.release_sequence(1)
    c.release_sequence(0)
    for seq, base in ((2, 100), (3, 200)):
        prefill(c, seq, list(range(base, base + 12)))
    assert c.lookup_prefix(prompt + [1]) == 0
    # Without states in the pool nothing is held beyond the slots: 0, and nothing changes.
    layers = [kvcore.LayerConfig(kvcore.State(1))] * 2 + [kvcore.LayerConfig(kvcore.Flat(), 1, 4)]
    apart = kvcore.BatchCache(kvcore.CacheConfig(64, layers, max_step=8, batch=kvcore.BatchLimits(
        block_size=B, max_seqs=4, state_snapshots=1)))
    prefill(apart, 0, prompt)
    free = apart.free_blocks(0)
    assert apart.release_named_state(0) == 0 and apart.free_blocks(0) == free


def test_release_named_state_refuses_a_bad_or_inactive_sequence_and_changes_nothing() -> None:
    c = hybrid(num_blocks=16)
    prefill(c, 0, list(range(10, 18)))
    step = c.begin_step([(0, 1, [1])])
    free = c.free_blocks(0)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"release_named_state: sequence 4 must be in \[0, max_seqs = 4\)"):
        c.release_named_state(4)
    with pytest.raises(kvcore.InvalidStateError, match=r"release_named_state: sequence 2 is not active"):
        c.release_named_state(2)
    assert c.free_blocks(0) == free
    step.commit()  # the refused calls left the begun step begun
    assert c.length(0) == 9


def test_byte_layers_that_keep_states_apart_refuse_the_cache_by_name() -> None:
    c = hybrid()
    with pytest.raises(kvcore.NotSupportedError, match=r"layer 0: its states live in the pages of layer 2's storage"):
        kvcore.PagedKVPool(c, np.float32, state_tensors={"h": ((2,), np.float32)})
    torch_paged = pytest.importorskip("kvcore.torch.paged")
    with pytest.raises(kvcore.NotSupportedError, match=r"layer 0: its states live in the pages of layer 2's storage"):
        torch_paged.TorchPagedKVPool(c)


def test_states_in_pool_must_be_a_bool_and_shows_in_the_repr() -> None:
    with pytest.raises(kvcore.InvalidArgumentError, match=r"states_in_pool = 1: must be a bool"):
        kvcore.BatchLimits(states_in_pool=1)  # type: ignore[arg-type]
    limits = kvcore.BatchLimits(states_in_pool=True)
    assert limits.states_in_pool is True
    assert "states_in_pool=True" in repr(limits)
    assert "states_in_pool" not in repr(kvcore.BatchLimits())
