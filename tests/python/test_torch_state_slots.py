"""kvcore.torch.state_slots: State layers' named state tensors in D slots, addressed by the plans.

A reference recurrence (s_p = 0.5 * s_{p-1} + x_p, per named state) runs through a
SequenceCache and a TorchStateSlots: plain steps, verify steps with partial commits,
rewinds and draft trees; every read must equal the recurrence over the accepted
tokens. Refusals change nothing.
"""

from __future__ import annotations

import pytest
from needs import need

torch = need("torch")

import kvcore  # noqa: E402
from kvcore.torch.state_slots import TorchStateSlots, plan_slot  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make(D: int = 5, max_step: int = 8, batch_first: bool = False) -> tuple[kvcore.SequenceCache, TorchStateSlots]:
    layers = [kvcore.LayerConfig(kvcore.Flat(), n_kv_heads=1, head_dim=4), kvcore.LayerConfig(kvcore.State(D))]
    cache = kvcore.SequenceCache(kvcore.CacheConfig(capacity=256, max_step=max_step, layers=layers))
    return cache, TorchStateSlots(cache, batch_first=batch_first)


def reference(tokens: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """States after the last token: "conv" [2, 3] and "recurrent" [2] (float64), batch 2."""
    conv, rec = torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.float32)
    for x in tokens:
        conv, rec = 0.5 * conv + x, 0.25 * rec + x
    return conv, rec


def run_step(slots: TorchStateSlots, step: kvcore.Step, xs: list[float]) -> None:
    """The step reads the state before it and writes the state after each token (the plan keeps
    what it keeps: every one in a verify step, the last in a plain step)."""
    plan = step.plan(1)
    conv = slots.read(1, "conv", plan, step.position)
    rec = slots.read(1, "recurrent", plan, step.position)
    conv = torch.zeros(2, 3, dtype=torch.float64) if conv is None else conv.clone()
    rec = torch.zeros(2) if rec is None else rec.clone()
    convs, recs = [], []
    for x in xs:
        conv, rec = 0.5 * conv + x, 0.25 * rec + x
        convs.append(conv)
        recs.append(rec)
    kept = slots.write(1, "conv", plan, step.position, torch.stack(convs, dim=1))
    assert kept == (len(xs) if step.verify else 1)
    slots.write(1, "recurrent", plan, step.position, torch.stack(recs, dim=1))


def check(slots: TorchStateSlots, cache: kvcore.SequenceCache, tokens: list[float]) -> None:
    """The next step reads the reference state after ``tokens``."""
    step = cache.begin_step(1)
    conv, rec = reference(tokens)
    got_conv = slots.read(1, "conv", step.plan(1), step.position)
    got_rec = slots.read(1, "recurrent", step.plan(1), step.position)
    assert got_conv is not None and got_rec is not None
    assert torch.equal(got_conv, conv) and torch.equal(got_rec, rec)
    step.abort()


@pytest.mark.parametrize("batch_first", [False, True], ids=["slots-first", "batch-first"])
def test_plain_and_verify_steps_partial_commits_and_rewinds_read_the_reference(batch_first: bool) -> None:
    cache, slots = make(batch_first=batch_first)
    tokens: list[float] = []
    step = cache.begin_step(6)  # a prefill chunk keeps only its last state
    run_step(slots, step, [1, 2, 3, 4, 5, 6])
    assert len([r for r in step.plan(1).write]) == 1
    cache.commit(step)
    tokens += [1, 2, 3, 4, 5, 6]
    check(slots, cache, tokens)
    verify = cache.begin_step(4, verify=True)  # keeps each of its 4 states
    run_step(slots, verify, [7, 8, 9, 10])
    cache.commit(verify, [0, 1])  # two accepted, two rejected
    tokens += [7, 8]
    check(slots, cache, tokens)
    decode = cache.begin_step(1)  # a decode step after the partial commit
    run_step(slots, decode, [11])
    cache.commit(decode)
    tokens += [11]
    check(slots, cache, tokens)
    cache.rewind(8)  # the state after 7 is still held (verify step's slot)
    check(slots, cache, tokens[:8])
    shape = (5, 2, 3) if not batch_first else (2, 5, 3)
    tensor = slots.tensor(1, "conv")
    assert tensor is not None and tuple(tensor.shape) == shape and tensor.dtype == torch.float64
    assert slots.nbytes() == slots.nbytes(1) == 5 * 2 * (3 * 8 + 4)


def test_a_tree_commit_copies_the_accepted_path_into_its_slots() -> None:
    cache, slots = make()
    step = cache.begin_step(2)
    run_step(slots, step, [1, 2])
    cache.commit(step)
    tree = cache.begin_tree([-1, 0, 0, 2])  # main line 0 -> 1, branch 0 -> 2 -> 3
    rows = tree.tree_rows(1).tolist()
    plan = tree.plan(1)
    xs = [3.0, 4.0, 5.0, 6.0]
    parents = [-1, 0, 0, 2]
    for node, x in enumerate(xs):  # node i reads its parent's slot, writes its own
        for name, decay in (("conv", 0.5), ("recurrent", 0.25)):
            before = slots.read(1, name, plan, 2) if parents[node] < 0 else slots.slot(1, name, rows[parents[node]])
            assert before is not None
            slots.slot(1, name, rows[node]).copy_(decay * before + x)
    copies = cache.commit(tree, [0, 2, 3])
    slots.apply_copies(copies)
    check(slots, cache, [1, 2, 3, 5, 6])


def test_plan_slot_names_read_and_written_positions() -> None:
    cache, _ = make(D=4)
    cache.commit(cache.begin_step(5))
    step = cache.begin_step(3, verify=True)
    plan = step.plan(1)
    assert [plan_slot(plan, p) for p in (3, 4, 5, 6, 7, 8)] == [None, 0, 1, 2, 3, None]


def test_refusals_name_the_value_and_change_nothing() -> None:
    cache, slots = make(D=4)
    step = cache.begin_step(4)
    plan = step.plan(1)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"layer = 0: not a State layer of the cache \(its State "
                                                          r"layers: \[1\]\)"):  # fmt: skip
        slots.write(0, "conv", plan, 0, torch.zeros(1, 1, 3))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"positions \[3, 5\): layer 1's step covers \[0, 4\)"):
        slots.write(1, "conv", plan, 3, torch.zeros(1, 2, 3))
    slots.write(1, "conv", plan, 3, torch.ones(1, 1, 3))
    before = slots.tensor(1, "conv")
    assert before is not None
    before = before.clone()
    stored = r"state 'conv' of layer 1: \(1, 4\) torch.float32 on cpu, but the layer stores \(1, 3\) torch.float32"
    with pytest.raises(kvcore.InvalidArgumentError, match=stored):
        slots.write(1, "conv", plan, 3, torch.zeros(1, 1, 4))
    with pytest.raises(kvcore.InvalidArgumentError, match=r"position = 2: layer 1's plan does not keep the state after"):
        slots.read(1, "conv", plan, 2)  # inside a plain step
    with pytest.raises(kvcore.InvalidArgumentError, match=r"states \(3,\): must be \[batch, n positions, \*state"):
        slots.write(1, "conv", plan, 3, torch.zeros(3))
    span = slots.span(1, plan, 0, 2)  # the first two positions of a plain step of 4: neither kept
    n_range = r"states \(1, 3, 3\) of layer 1: must be \[batch, n, \*state shape\] with n in \[1, 2\]"
    with pytest.raises(kvcore.InvalidArgumentError, match=n_range):
        slots.write_states(1, "conv", span, torch.zeros(1, 3, 3))
    with pytest.raises(kvcore.InvalidStateError, match=r"layer 1: the step does not keep the state after position 1"):
        slots.prepare(1, "conv", span)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"slot = 4: layer 1 keeps slots \[0, 4\)"):
        slots.slot(1, "conv", 4)
    with pytest.raises(kvcore.InvalidStateError, match=r"layer 1 holds no state 'recurrent' yet"):
        slots.slot(1, "recurrent", 0)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"copies: 1 entries, one per layer \(2\)"):
        slots.apply_copies([[]])
    with pytest.raises(kvcore.InvalidArgumentError, match=r"copy \[0, 4\] of layer 1: slots are \[0, 4\)"):
        slots.apply_copies([[], [[0, 4]]])
    after = slots.tensor(1, "conv")
    assert after is not None and torch.equal(after, before)
    cache.commit(step)
    with pytest.raises(kvcore.InvalidStateError, match=r"plan of layer 1: not the layer's plan of the cache's begun "
                                                       r"step \(stale\)"):  # fmt: skip
        slots.write(1, "conv", plan, 3, torch.ones(1, 1, 3))


def test_a_tree_node_reads_its_parents_slot_and_keeps_its_own() -> None:
    cache, slots = make(D=5)
    cache.commit(cache.begin_step(3))
    chain = cache.begin_step(2)
    with pytest.raises(kvcore.InvalidArgumentError, match=r"node = 0: layer 1's step is not a draft tree with nodes \[0, 2\)"):
        slots.node_span(1, chain, 0)  # a chain step has no nodes
    chain.abort()
    step = cache.begin_tree([-1, 0, 0, 2])
    rows = step.tree_rows(1)
    spans = [slots.node_span(1, step, i) for i in range(4)]
    # The root reads the state after the last committed token; the others their parent's slot.
    assert spans[0].read == (3 - 1) % 5
    assert [s.read for s in spans[1:]] == [int(rows[0]), int(rows[0]), int(rows[2])]
    assert [s.keep for s in spans] == [((3 + int(step.chain_index[i]), int(rows[i])),) for i in range(4)]
    with pytest.raises(kvcore.InvalidArgumentError, match=r"node = 4: layer 1's step is not a draft tree with nodes \[0, 4\)"):
        slots.node_span(1, step, 4)


def test_map_batch_and_release() -> None:
    cache, slots = make()
    step = cache.begin_step(1)
    slots.write(1, "conv", step.plan(1), 0, torch.arange(3.0)[:, None, None].expand(3, 1, 2))
    slots.map_batch(1, lambda t: t[torch.tensor([2, 0])])
    t = slots.tensor(1, "conv")
    assert t is not None and t.shape == (5, 2, 2) and t[0, :, 0].tolist() == [2.0, 0.0]
    assert slots.batch_size == 2
    slots.release()
    assert slots.tensor(1, "conv") is None and slots.nbytes() == 0 and slots.batch_size is None
