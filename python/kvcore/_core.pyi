"""Stubs for kvcore._core, the compiled half of kvcore (hand-written; keep in step
with python/src/*.cpp: `python -m mypy.stubtest kvcore` checks them).

Integer arguments accept any int (or object with __index__); values outside the
32-bit signed range raise InvalidArgumentError naming the value.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, Literal, Protocol, SupportsIndex, overload

import numpy as np
import numpy.typing as npt

# Stands in for pybind11's metaclass (pybind11_builtins.pybind11_type, which has no
# stubs) so stubtest sees that every bound class has one: give it to each new class.
class _pybind11_type(type): ...

__version__: str

def error_codes() -> dict[str, int]:
    """kvcore::Error names and values as the C++ core defines them (ExecuTorch's Error values)."""

# --- config.cpp ----------------------------------------------------------------

class LayerPolicy(metaclass=_pybind11_type):
    """How one layer keeps its history: Flat(), Ring(...), Chunked(...), Shared(...) or State(...)
    (docs/design.md sections 2 and 9; docs/layer_kinds.md).
    """

    class Kind(metaclass=_pybind11_type):
        """Flat (full history), Ring (sliding window), Chunked (attention within chunks), Shared
        (another layer's K/V) or State (recurrent state snapshots).

        Members:

        Flat

        Ring

        Chunked

        Shared

        State
        """

        Flat: ClassVar[LayerPolicy.Kind]
        Ring: ClassVar[LayerPolicy.Kind]
        Chunked: ClassVar[LayerPolicy.Kind]
        Shared: ClassVar[LayerPolicy.Kind]
        State: ClassVar[LayerPolicy.Kind]
        __members__: ClassVar[dict[str, LayerPolicy.Kind]]
        def __init__(self, value: SupportsIndex) -> None: ...
        def __eq__(self, other: object) -> bool: ...
        def __ne__(self, other: object) -> bool: ...
        def __hash__(self) -> int: ...
        def __int__(self) -> int: ...
        def __index__(self) -> int: ...
        def __getstate__(self) -> int: ...
        def __setstate__(self, state: SupportsIndex) -> None: ...
        @property
        def name(self) -> str: ...
        @property
        def value(self) -> int: ...

    @property
    def kind(self) -> LayerPolicy.Kind:
        """The LayerPolicy.Kind."""
    @property
    def window(self) -> int:
        """Ring: keys a query sees, counting itself (positions q - window + 1 .. q). Chunked: the
        chunk size K (a query at q sees K * (q // K) .. q). Otherwise 0.
        """
    @property
    def sinks(self) -> int:
        """Ring: first positions every query sees, kept forever. Otherwise 0."""
    @property
    def source(self) -> int:
        """Shared: the earlier layer whose K/V this layer reads. Otherwise 0."""
    @property
    def slots(self) -> int:
        """State: state snapshots kept per sequence, D (slot of position p: p % D). Otherwise 0."""
    @property
    def is_ring(self) -> bool:
        """True for a Ring policy."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __copy__(self) -> LayerPolicy:
        """A copy of the value (it is immutable)."""
    def __deepcopy__(self, memo: dict[int, Any]) -> LayerPolicy:
        """A copy of the value (it is immutable)."""

def Flat() -> LayerPolicy:
    """Full history: every earlier key is visible."""

def Ring(window: SupportsIndex, sinks: SupportsIndex = 0) -> LayerPolicy:
    """Sliding window of `window` keys counting the query itself, plus `sinks` first
    positions kept forever."""

def Chunked(chunk: SupportsIndex) -> LayerPolicy:
    """Chunked attention (Llama 4): a query at q sees the keys k <= q of its own chunk, k // chunk
    == q // chunk. Its rows: a ring of chunk + max_step - 1. InvalidArgumentError: chunk < 1.
    """

def Shared(source: SupportsIndex) -> LayerPolicy:
    """A layer that reuses layer `source`'s K/V (Gemma 3n's shared KV layers): it holds no rows,
    writes nothing and reads what its source reads after the source's writes. The source must be an
    earlier Flat, Ring or Chunked layer of the same shape (CacheConfig checks).
    InvalidArgumentError: source < 0.
    """

def State(slots: SupportsIndex) -> LayerPolicy:
    """A recurrent-state layer (Mamba, gated DeltaNet, short convolutions) keeping `slots` state
    snapshots per sequence, slot(p) = p % slots: the token at p reads the state after p - 1 and
    writes the state after p. A verify step (begin_step(T, verify=True)) or tree keeps the state
    after each position and needs T <= slots - 1; other steps keep only the last. Its LayerConfig
    has n_kv_heads = head_dim = 0 (the byte layer knows the state's shape). InvalidArgumentError:
    slots < 1.
    """

class LayerConfig(metaclass=_pybind11_type):
    """One layer's policy and K/V row shape."""

    def __init__(
        self,
        policy: LayerPolicy,
        n_kv_heads: SupportsIndex = 0,
        head_dim: SupportsIndex = 0,
        v_head_dim: SupportsIndex = 0,
    ) -> None:
        """policy: Flat(), Ring(...), Chunked(...), Shared(...) or State(...). A K row is n_kv_heads
        x head_dim elements, a V row n_kv_heads x v_head_dim (0: head_dim). A State layer holds no
        K/V rows: leave the three at 0. InvalidArgumentError naming the field when a count is below
        1 (v_head_dim: below 0), or nonzero on a State layer.
        """
    @property
    def policy(self) -> LayerPolicy:
        """Flat(), Ring(...), Chunked(...), Shared(...) or State(...)."""
    @property
    def n_kv_heads(self) -> int:
        """K/V heads per row."""
    @property
    def head_dim(self) -> int:
        """Elements per head of a K row."""
    @property
    def v_head_dim(self) -> int:
        """Elements per head of a V row as given; 0 means head_dim (see value_dim)."""
    @property
    def value_dim(self) -> int:
        """Elements per head of a V row: v_head_dim, or head_dim when it is 0."""
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __copy__(self) -> LayerConfig:
        """A copy of the value (it is immutable)."""
    def __deepcopy__(self, memo: dict[int, Any]) -> LayerConfig:
        """A copy of the value (it is immutable)."""

class BatchLimits(metaclass=_pybind11_type):
    """Limits of a many-sequence cache (BatchCache), fixed at its creation: every table it keeps is
    sized from them, so no step allocates. A SequenceCache ignores them.
    """

    def __init__(
        self,
        *,
        block_size: SupportsIndex = 16,
        max_seqs: SupportsIndex = 64,
        max_step_tokens: SupportsIndex = 0,
        num_blocks: SupportsIndex = 0,
        max_holes: SupportsIndex = 8,
        max_active_seqs: SupportsIndex = 0,
        state_snapshots: SupportsIndex = 0,
        page_layers: SupportsIndex = 0,
        max_rewind: SupportsIndex = -1,
        states_in_pool: bool = False,
        table_page_blocks: SupportsIndex = 0,
        table_pages: SupportsIndex = 0,
        state_block_size: SupportsIndex = 0,
    ) -> None:
        """block_size: rows per block (1 = cell-granular). max_seqs: sequence ids are 0..max_seqs-1.
        max_step_tokens: new tokens of one step over all its sequences (0: max_seqs * max_step, at
        most 2**20). num_blocks: blocks of the one pool every group draws from (0: what each group
        would need alone for max_active_seqs sequences, summed: a full table row per flat group, a
        window's blocks per ring). max_holes: removed middle ranges one sequence keeps apart.
        max_active_seqs: sequences active at once (0: max_seqs); each group's block tables hold one
        row of ceil(capacity / block_size) entries per active sequence. state_snapshots: named state
        snapshots each State group keeps for prefix reuse (a step ending on a full block names the
        state after it; 0: a model with State layers never hits a prefix), one state slot each.
        page_layers: layers of one policy form groups of at most this many, so that the pool's pages
        (one layer of each group) leave no storage unused (0: the fewest layers any policy has,
        vLLM's rule). max_rewind: the longest rewind, in positions, that ring and chunked groups
        keep history for (each position costs every sequence a ring position; -1: max_step, 0: never
        rewinds, as vLLM's sliding window; in [-1, capacity]). states_in_pool: the State groups take
        their state slots from the one pool, one block per state, and State layers form groups of at
        most page_layers as K/V layers do (vLLM's hybrid allocator; docs/batch.md section 10): a
        named snapshot is then a cached block, kept until the pool needs it, and state_snapshots > 0
        only turns naming on; False: each State group owns slots of its own beside the pool
        (InvalidArgumentError: not a bool). table_page_blocks: 0 keeps each group's block table row
        a dense array of ceil(capacity / block_size) entries per active sequence; P (a power of two
        in [1, 2**20]) pages the rows: a row is a directory of pages of P entries taken when it
        first names a block in a page's span and given back once the page names none, so the tables
        cost what the sequences hold (docs/batch.md section 5, 'Tables sized by use'); a plan's
        entry_tables reads either layout. table_pages: with paged tables, the pages every group
        draws from (0: every active row full in every group); a step, fork, adopt_prefix or admit
        short of pages raises CapacityError and changes nothing. state_block_size: the State groups'
        block, in tokens: a committed step names the state at its end only at a multiple of it, so
        hits on State layers land there (vLLM's mamba align mode at its block size; fewer snapshots,
        coarser hits): 0 or block_size, or a larger multiple of block_size up to capacity; an
        imported record still names its one state at its length when that ends a full block. Checked
        when a BatchCache is built (InvalidArgumentError naming the field).
        """
    @property
    def block_size(self) -> int:
        """Rows per block."""
    @property
    def max_seqs(self) -> int:
        """Sequence ids are 0..max_seqs-1."""
    @property
    def max_step_tokens(self) -> int:
        """New tokens of one step over all sequences (0: the default)."""
    @property
    def num_blocks(self) -> int:
        """Blocks of the one pool every group draws from (0: the default)."""
    @property
    def max_holes(self) -> int:
        """Removed middle ranges one sequence keeps apart."""
    @property
    def max_active_seqs(self) -> int:
        """Sequences active at once: block table rows per group (0: max_seqs)."""
    @property
    def state_snapshots(self) -> int:
        """Named state snapshots per State group for prefix reuse (0: none)."""
    @property
    def page_layers(self) -> int:
        """Most layers of one group (0: the fewest layers any policy has)."""
    @property
    def max_rewind(self) -> int:
        """Longest rewind, in positions, ring and chunked groups keep history for (-1: max_step)."""
    @property
    def states_in_pool(self) -> bool:
        """Do the State groups take their state slots from the one pool (one block per state)?"""
    @property
    def table_page_blocks(self) -> int:
        """Block table entries per table page (0: unpaged, a dense row per active sequence)."""
    @property
    def table_pages(self) -> int:
        """Table pages every group draws from when paged (0: every active row full)."""
    @property
    def state_block_size(self) -> int:
        """The State groups' block in tokens: states are named only at its multiples (0:
        block_size).
        """
    def __copy__(self) -> BatchLimits:
        """A copy of the value (it is immutable)."""
    def __deepcopy__(self, memo: dict[int, Any]) -> BatchLimits:
        """A copy of the value (it is immutable)."""

class CacheConfig(metaclass=_pybind11_type):
    """Model facts and per-layer policies, validated on construction."""

    def __init__(
        self,
        capacity: SupportsIndex,
        layers: LayerConfig | Sequence[LayerConfig],
        *,
        n_layers: SupportsIndex | None = None,
        max_step: SupportsIndex | None = None,
        initial_capacity: SupportsIndex = 512,
        batch: BatchLimits = ...,
    ) -> None:
        """capacity: largest logical length (positions). layers: one LayerConfig for every layer or
        one per layer. n_layers: defaults to len(layers). max_step: largest T of one step (default
        min(512, capacity)). initial_capacity: rows a byte layer allocates per layer before growing.
        batch: the limits of a BatchCache built from it. Validated here: InvalidArgumentError naming
        the field and the rule.
        """
    @property
    def capacity(self) -> int:
        """Largest logical length (positions 0..capacity-1)."""
    @property
    def n_layers(self) -> int:
        """Number of layers."""
    @property
    def max_step(self) -> int:
        """Largest T (tokens) of one step, default applied."""
    @property
    def initial_capacity(self) -> int:
        """Rows a byte layer (KVPool) allocates per flat layer before growing lazily."""
    @property
    def layers(self) -> tuple[LayerConfig, ...]:
        """One LayerConfig per layer (a broadcast config repeated)."""
    @property
    def batch(self) -> BatchLimits:
        """The limits a many-sequence cache (BatchCache) built from it has."""
    def __copy__(self) -> CacheConfig:
        """A copy of the value (it is immutable)."""
    def __deepcopy__(self, memo: dict[int, Any]) -> CacheConfig:
        """A copy of the value (it is immutable)."""

# --- cache.cpp -----------------------------------------------------------------

class Run(metaclass=_pybind11_type):
    """`len` consecutive rows from `row`, holding positions from `pos`."""

    def __init__(self, row: SupportsIndex, len: SupportsIndex, pos: SupportsIndex) -> None:
        """A run: `len` rows from `row` holding positions from `pos` (ints; InvalidArgumentError
        when one does not fit a 32-bit int). Plans check every run they are given.
        """
    @property
    def row(self) -> int:
        """First row of the run."""
    @property
    def len(self) -> int:
        """Rows (and positions) in the run."""
    @property
    def pos(self) -> int:
        """Position held by the first row; row + i holds pos + i."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __iter__(self) -> Iterator[int]: ...
    def __copy__(self) -> Run:
        """A copy of the value (it is immutable)."""
    def __deepcopy__(self, memo: dict[int, Any]) -> Run:
        """A copy of the value (it is immutable)."""

class SeqStepPlan(metaclass=_pybind11_type):
    """One layer's plan for one step."""

    @property
    def write(self) -> tuple[Run, ...]:
        """Where the step's rows go: at most 2 Runs in position order (input row j is position P +
        j).
        """
    @property
    def read(self) -> tuple[Run, ...]:
        """Every row a query of the step may see: at most 3 Runs (sinks and a wrapped window) in
        increasing position order.
        """
    @property
    def write_len(self) -> int:
        """Rows the step writes: its T."""
    @property
    def read_len(self) -> int:
        """Rows the read names."""
    @property
    def is_contiguous(self) -> bool:
        """True when the write and the read are one run each."""
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __copy__(self) -> SeqStepPlan:
        """A copy of the value (it is immutable)."""
    def __deepcopy__(self, memo: dict[int, Any]) -> SeqStepPlan:
        """A copy of the value (it is immutable)."""

class CacheBase(metaclass=_pybind11_type):
    """Any cache a registry can hold. A cache made by C++ code without RTTI reaches Python as this
    class; kvcore's own come as SequenceCache or BatchCache.
    """

class LayerGeometry(metaclass=_pybind11_type):
    """How one layer's positions map onto its rows (SequenceCache.geometry(layer)): the one source
    of a layer's layout, which byte layers and the memory planner read.
    """

    @property
    def rows(self) -> int:
        """Rows the layer's storage holds (rows(layer))."""
    @property
    def sink_rows(self) -> int:
        """Rows [0, sink_rows) hold positions [0, sink_rows) for ever: a wrapping ring's attention
        sinks (0 for flat layers and rings that never wrap).
        """
    @property
    def ring_rows(self) -> int:
        """Rows reused in turn after the sinks: position p >= sink_rows lives in row sink_rows + (p
        - sink_rows) % ring_rows; 0 when the layer never wraps.
        """
    @property
    def wraps(self) -> bool:
        """True when rows are reused (ring_rows != 0)."""
    @property
    def mirror_rows(self) -> int:
        """Rows a mirrored byte layer repeats after the last row (copies of the first ring rows) so
        a wrapped window is one span: ring_rows - 1 for a wrapping ring without sinks, else 0.
        """
    def row(self, position: SupportsIndex) -> int:
        """The row that holds `position` (>= 0)."""
    def held_rows(self, end: SupportsIndex) -> int:
        """Rows that hold a position once positions [0, end) were written: min(end, rows)."""
    def position_at(self, row: SupportsIndex, end: SupportsIndex) -> int:
        """The position `row` stands for once positions [0, end) were written (the latest mapped to
        it); -1 when none is.
        """
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __copy__(self) -> LayerGeometry:
        """A copy of the value (it is immutable)."""
    def __deepcopy__(self, memo: dict[int, Any]) -> LayerGeometry:
        """A copy of the value (it is immutable)."""

class _DLPackTensor(Protocol):
    """A tensor with the DLPack protocol (a CPU torch tensor): read through numpy.from_dlpack."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...

# A 1-D integer array argument (the batch verbs, begin_tree, commit): int32 or int64, contiguous (numpy,
# array.array, anything with the buffer protocol, a DLPack tensor), or a sequence of ints.
IntArrayArg = npt.NDArray[np.signedinteger[Any]] | Sequence[SupportsIndex] | _DLPackTensor

class Step(metaclass=_pybind11_type):
    """A begun step. As a context manager it commits on normal exit and leaves the
    step uncommitted when the body raises."""

    @property
    def position(self) -> int:
        """First position the step writes: the length when it was begun."""
    @property
    def T(self) -> int:
        """Tokens in the step."""
    @property
    def verify(self) -> bool:
        """True when the step may be rewound into (begun with verify=True, or a tree): State layers
        keep the state after each of its positions.
        """
    @property
    def end(self) -> int:
        """position + T: the length once committed."""
    @property
    def is_current(self) -> bool:
        """True while this is the cache's begun, uncommitted step (a commit, rewind, clear or new
        begin_step ends it).
        """
    @property
    def cache(self) -> SequenceCache:
        """The SequenceCache that began the step (a byte layer refuses another cache's step by it)."""
    def plan(self, layer: SupportsIndex) -> SeqStepPlan:
        """The SeqStepPlan of `layer` for this step. InvalidArgumentError: bad layer;
        InvalidStateError: the step is no longer current.
        """
    def mask(self, layer: SupportsIndex, *, order: str = "rows") -> npt.NDArray[np.bool_]:
        """Boolean numpy array (T, n): mask[i, j] is True when the step's query i (position P + i)
        may see the j-th row of layer's read (the visibility rule), in the order KVPool.update/read
        return them with the same `order`: 'rows' (n = the held rows, as they lie) or 'positions' (n
        = the plan's read_len, increasing positions). Read-only: layers of one policy share it. A
        Shared layer's mask is its source's. InvalidArgumentError: bad layer or order, or a State
        layer (it has no keys); InvalidStateError: the step is no longer the begun step.
        """
    @overload
    def commit(self, accepted: None = None) -> None:
        """Without `accepted`: length = end (a tree step only when it is a chain), returns None.
        With `accepted` (node indices of the accepted root path, accepted[0] = 0, each a child of
        the one before; a list or 1-D int array): length = position + len(accepted), returns per
        layer an int32 (n, 2) array of row copies [src, dst] to perform, in order, before the next
        step (KVPool.apply_copies): none on the main line. InvalidArgumentError: a tree committed
        without `accepted` (not a chain), or `accepted` not a root path; InvalidStateError: the step
        is no longer current. Nothing changes on an error.
        """
    @overload
    def commit(self, accepted: IntArrayArg) -> list[npt.NDArray[np.int32]]:
        ...
    @property
    def is_tree(self) -> bool:
        """True for a draft tree that branches: begun by begin_tree with a node off the chain
        (commit it with its accepted path). A chain is not a tree however it was begun (begin_step,
        or begin_tree with parents[i] = i - 1), as for BatchStepPlan.is_tree.
        """
    @property
    def parents(self) -> npt.NDArray[np.int32]:
        """int32 (T,): each token's parent in the step's tree, -1 for the root (a chain step: i -
        1). Read-only copy, made once per Step. InvalidStateError: the step is no longer current.
        """
    @property
    def positions(self) -> npt.NDArray[np.int64]:
        """int64 (T,): each token's position, length + depth (a chain step: position + i): the
        position ids for RoPE. Read-only. InvalidStateError: the step is no longer current.
        """
    @property
    def chain_index(self) -> npt.NDArray[np.int32]:
        """int32 (T,): token i is written to the row the chain plan of T gives position
        step.position + chain_index[i]; the main line (node 0, its first child, ...) sits in place.
        Read-only. InvalidStateError: the step is no longer current.
        """
    @property
    def tree_mask_packed(self) -> npt.NDArray[np.uint32]:
        """uint32 (T, ceil(T / 32)): the packed ancestor mask, row i bit j (word j // 32, bit j %
        32, little bit order) set when token j is i or an ancestor of i: TensorRT-LLM's
        spec_decoding_packed_mask layout (view as int32). Read-only. InvalidStateError: the step is
        no longer current.
        """
    def tree_rows(self, layer: SupportsIndex) -> npt.NDArray[np.int32]:
        """int32 (T,): the row each token writes on `layer` (its slot: the chain plan's row of
        position + chain_index). InvalidArgumentError: bad layer; InvalidStateError: the step is no
        longer current.
        """
    def dense_tree_mask(self, layer: SupportsIndex) -> npt.NDArray[np.bool_]:
        """bool (T, read_len): mask[i, j] is True when token i may see the key of the j-th row of
        `layer`'s plan read (position order, as KVPool.update(..., order='positions') returns them):
        committed history by the layer's window rule at i's position, and in the tree only i itself
        and its ancestors, within the window. InvalidArgumentError: bad layer or a chain step;
        InvalidStateError: the step is no longer current.
        """
    def abort(self) -> None:
        """Ends the step without committing it: the length stays, no step is begun (its rows
        still count as written for can_rewind: the backend may have written them).
        InvalidStateError: the step is no longer current; nothing changes."""
    def __enter__(self) -> Step: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]: ...
    def __deepcopy__(self, memo: dict[int, Any]) -> Step:
        """The same step of a deep copy of its cache (the clone keeps the begun step)."""

class SequenceCache(CacheBase, metaclass=_pybind11_type):
    """One sequence's cache: one logical length over flat (full history), ring (sliding window,
    optional sinks), chunked (attention within chunks), shared (another layer's K/V) and state
    (recurrent state snapshots) layers. It plans each step with integers: where the step's K/V rows
    go and which rows each query reads (a byte layer such as KVPool applies the plans). Positions
    are token indices from 0; a step adds T tokens at positions length .. length + T - 1. A failing
    call raises and changes nothing.
    """

    def __init__(self, config: CacheConfig) -> None:
        """Builds the cache (identical layer policies share one policy object). AllocationError when
        its tables cannot be allocated.
        """
    @property
    def length(self) -> int:
        """Committed length L: positions [0, L) hold K/V."""
    @property
    def capacity(self) -> int:
        """Largest allowed length (positions 0 .. capacity - 1)."""
    @property
    def max_step(self) -> int:
        """Largest T of one step (C)."""
    @property
    def n_layers(self) -> int:
        """Layers."""
    @property
    def n_groups(self) -> int:
        """Groups: layers with identical policies share one policy object and plan alike (every
        layer has a group, a State or Shared one too).
        """
    @property
    def n_policies(self) -> int:
        """Deprecated alias of n_groups (removed in kvcore 0.2.0): groups, layers with identical
        policies sharing one policy object. Warns DeprecationWarning.
        """
    @property
    def config(self) -> CacheConfig:
        """The CacheConfig it was built from (max_step resolved, one entry per layer), a new object.
        """
    @property
    def active_step(self) -> Step | None:
        """The begun, uncommitted Step, or None."""
    def group_of(self, layer: SupportsIndex) -> int:
        """The group of `layer`, in [0, n_groups): layers of one group share one policy object and
        plan alike. InvalidArgumentError: bad layer.
        """
    def policy_index(self, layer: SupportsIndex) -> int:
        """Deprecated alias of group_of (removed in kvcore 0.2.0): the group of `layer`. Warns
        DeprecationWarning; InvalidArgumentError: bad layer.
        """
    def layer_policy(self, layer: SupportsIndex) -> LayerPolicy:
        """The LayerPolicy of `layer`. InvalidArgumentError: bad layer."""
    def rows(self, layer: SupportsIndex) -> int:
        """Rows a byte layer holds for `layer`: capacity for a flat layer, min(capacity, sinks +
        window + max_step - 1) for a ring, min(capacity, chunk + max_step - 1) for a chunked layer,
        0 for a shared layer, slots (state snapshots) for a state layer. InvalidArgumentError: bad
        layer.
        """
    def geometry(self, layer: SupportsIndex) -> LayerGeometry:
        """The LayerGeometry of `layer`: how its positions map onto its rows. InvalidArgumentError:
        bad layer.
        """
    def can_extend(self, n: SupportsIndex = 1) -> bool:
        """True when n >= 0 and length + n <= capacity. Never raises."""
    def begin_step(self, T: SupportsIndex, verify: bool = False) -> Step:
        """Begins a step of T tokens at position length (replacing an uncommitted step) and returns
        its Step. From then on the step's rows count as written. verify=True: the step may be
        rewound into (speculative verify), so State layers keep the state after each of its
        positions (needs T <= slots - 1); without it they keep only the last, and a rewind or
        partial commit into the step is refused. Other layers plan the same either way.
        InvalidArgumentError: T outside [1, max_step], or verify with T > slots - 1; CapacityError:
        length + T > capacity; InvalidStateError: a State layer lost the state after length - 1 (an
        aborted step overwrote its slot).
        """
    def step(self, T: SupportsIndex, verify: bool = False) -> Step:
        """begin_step(T, verify), for use as `with cache.step(T) as step:`."""
    def plan(self, layer: SupportsIndex, position: SupportsIndex, T: SupportsIndex) -> SeqStepPlan:
        """The SeqStepPlan of `layer` for the begun step at (position, T). InvalidArgumentError: bad
        layer; InvalidStateError: no such begun step.
        """
    def preview(self, layer: SupportsIndex, T: SupportsIndex, verify: bool = False) -> SeqStepPlan:
        """The plan layer would get from the next step of T tokens, without beginning it:
        begin_step(T, verify) then gives this very plan. Errors as begin_step, and
        InvalidArgumentError for a bad layer.
        """
    def row_layer(self, layer: SupportsIndex) -> int:
        """The layer whose rows `layer` reads: a Shared layer's source, else `layer` itself (a byte
        layer hands a Shared layer its source's K/V). InvalidArgumentError: bad layer.
        """
    @overload
    def commit(self, step: Step, accepted: None = None) -> None:
        """Commits `step` as Step.commit(accepted) does (returns None, or the copies per layer with
        `accepted`). InvalidStateError: not this cache's begun step.
        """
    @overload
    def commit(self, step: Step, accepted: IntArrayArg) -> list[npt.NDArray[np.int32]]:
        ...
    def begin_tree(self, parents: IntArrayArg) -> Step:
        """Begins a draft-tree step of N = len(parents) tokens (parents[0] = -1, then 0 <=
        parents[i] < i; a list or 1-D int array) and returns its Step (T = N; is_tree unless parents
        is a chain, parents[i] = i - 1). Token i stands at position length + depth(i); the step
        reserves and plans the rows of a chain step of N. InvalidArgumentError: N outside [1,
        max_step], parents[0] != -1, a second root, a parent not before its child; CapacityError:
        length + N > capacity. Nothing changes on an error.
        """
    def reserve_tree(self, max_nodes: SupportsIndex) -> None:
        """Sizes the tree storage for trees of up to max_nodes tokens (128 or max_step are reserved
        at construction), so begin_tree never allocates. InvalidArgumentError: max_nodes outside [1,
        max_step]; InvalidStateError: a tree step is begun and would need more room.
        """
    def commit_copies(self) -> list[npt.NDArray[np.int32]]:
        """Per layer, the int32 (n, 2) row copies [src, dst] of the last commit (empty after a chain
        commit), as commit(step, accepted) returned them.
        """
    def abort(self, step: Step) -> None:
        """Ends `step` without committing it (a failed forward): the length stays and no step
        is begun; its rows still count as written for can_rewind. InvalidStateError: not
        this cache's begun step; nothing changes."""
    def rewind(self, n: SupportsIndex) -> None:
        """length = n (speculative decoding's rejected drafts, a regenerated reply); ends a begun
        step. Allowed when every layer still holds what a query at n needs below n: any n on flat
        layers; once a ring wrapped, any n >= Lmax - max_step (Lmax: the longest length committed
        so far, not the length a rewind left) and n <= sinks. InvalidArgumentError: n outside
        [0, length]; InvalidStateError: history a query at n needs was overwritten.
        """
    def can_rewind(self, n: SupportsIndex) -> bool:
        """True exactly when rewind(n) would succeed. Never raises."""
    def clear(self) -> None:
        """length = 0; ends a begun step. Never fails."""
    def visible(self, layer: SupportsIndex, q: SupportsIndex, k: SupportsIndex) -> bool:
        """May a query at position q see the key at k on `layer`? (k <= q; on a ring also q - k <
        window or k < sinks; on a chunked layer k // chunk == q // chunk; a shared layer answers as
        its source; a state layer has no keys: False.) InvalidArgumentError: bad layer, q or k < 0.
        """
    def __copy__(self) -> SequenceCache:
        """An independent cache in the same state (copy.copy and copy.deepcopy alike): it continues
        exactly as this one would. AllocationError when it cannot be allocated.
        """
    def __deepcopy__(self, memo: dict[int, Any]) -> SequenceCache:
        """As __copy__; registered in `memo`, so objects sharing this cache share the copy."""

# --- registry.cpp ----------------------------------------------------------------
# The process-wide registries (kvcore::CacheRegistry / CacheBuilderRegistry::global()).
# Use them through kvcore.registry and kvcore.register_builder / build.

registry_storage_v2: object
"""PyCapsule holding the kvcore::RegistryStorage* (see kvcore/python_capsule.h)."""
REGISTRY_ABI_VERSION: int

def registry_install(key: str, cache: CacheBase | None) -> None:
    """Installs cache under key in the process registry. AlreadyRegisteredError: the key is taken;
    InvalidArgumentError: an empty or too long key, or cache None.
    """
def registry_install_unique(prefix: str, cache: CacheBase | None) -> str:
    """Installs cache under a fresh key 'prefix#N' and returns the key. InvalidArgumentError: a bad
    prefix or cache None.
    """
def registry_get(key: str) -> CacheBase | None:
    """The cache under key, or None."""
def registry_find(key: str) -> CacheBase:
    """The cache under key. NotFoundError naming the key when there is none."""
def registry_contains(key: str) -> bool:
    """Whether a cache is installed under key."""
def registry_erase(key: str) -> None:
    """Removes key (holders keep the cache alive). NotFoundError: no such key."""
def registry_erase_if_same(key: str, cache: CacheBase) -> None:
    """Removes key only while it still names this cache (a session's cleanup). NotFoundError: the
    key is absent or names another cache.
    """
def registry_keys() -> list[str]:
    """The installed keys, sorted."""
def registry_unique_key(prefix: str = "cache") -> str:
    """A key 'prefix#N' no cache is installed under (reserves nothing). InvalidArgumentError: a bad
    prefix.
    """
def register_builder(backend: str, kind: str, fn: Callable[[CacheConfig], CacheBase]) -> None:
    """Registers fn(config) -> cache as the builder of (backend, kind); C++ callers reach it too
    (they take the GIL). AlreadyRegisteredError: the pair has a builder; InvalidArgumentError: fn is
    not callable or a name is bad.
    """
def unregister_builder(backend: str, kind: str) -> None:
    """Removes the builder of (backend, kind). NotFoundError: it has none."""
def has_builder(backend: str, kind: str) -> bool:
    """Whether (backend, kind) has a builder."""
def builders() -> list[tuple[str, str]]:
    """The (backend, kind) pairs that have a builder, sorted."""
def build(backend: str, kind: str, config: CacheConfig) -> CacheBase:
    """Builds a cache with the builder of (backend, kind). NotFoundError: none registered;
    InvalidArgumentError: config breaks a rule; a Python builder's exception propagates unchanged;
    InternalError: a builder returned None or a non-cache.
    """

# --- pool.cpp ------------------------------------------------------------------

_Buffer = bytes | bytearray | memoryview | npt.NDArray[Any]
_WritableBuffer = bytearray | memoryview | npt.NDArray[Any]
_Tokens = Sequence[int] | npt.NDArray[Any]
# A State layer's tensors: name -> (shape, dtype), for every State layer or per State layer index.
_StateTensorSpec = Mapping[str, tuple[Sequence[int], npt.DTypeLike]]
_StateTensors = _StateTensorSpec | Mapping[int, _StateTensorSpec]

def check_record(record: _Buffer) -> None:
    """Validates a sequence record (docs/state.md) as an import does before reading it: size, magic,
    version, checksum and every field. InvalidArgumentError: truncated, corrupt or malformed (the
    message names the field); NotSupportedError: a version newer than this build reads.
    """

def seal_record(out: _WritableBuffer) -> None:
    """Writes the checksum of the record in the buffer `out` (its last 8 bytes, over every byte
    before them), for a writer that filled a record's rows itself. InvalidArgumentError: out not a
    buffer, read-only, not C-contiguous, or shorter than 72 bytes.
    """

class KVPool(metaclass=_pybind11_type):
    """Reference CPU storage for a SequenceCache's K/V rows and state slots: applies plans.

    A Shared layer stores nothing (read gives its source's rows); a State layer keeps its D state
    slots of the named tensors state_tensors gives (read_state, write_state, state_slots).

    dtype: float32, float16, bfloat16 (from ml_dtypes; "bfloat16" also works), int8 or uint8. Arrays
    are (T, n_kv_heads, head_dim) for K and (T, n_kv_heads, value_dim) for V, C-contiguous, of
    exactly the pool's dtype.
    """

    def __init__(
        self,
        cache: SequenceCache,
        dtype: npt.DTypeLike = ...,
        *,
        mirror_rings: bool = False,
        compute_dtype: npt.DTypeLike | None = None,
        state_tensors: _StateTensors | None = None,
    ) -> None:
        """Storage for every layer of `cache` in `dtype` (float32, float16, "bfloat16" with
        ml_dtypes, int8, uint8). Construction gives every layer, flat or ring,
        min(config.initial_capacity, rows(layer)) rows; a layer's storage then doubles, up to
        rows(layer), when a write reaches further (reserve() grows it ahead). mirror_rings: see the
        property. dtype 'qint8' or 'fp8_e4m3' stores quantized rows (docs/quantized.md): values go
        in and come out as compute_dtype (float32 by default, float16 or "bfloat16"). A Shared layer
        stores nothing: reads answer from its source's rows. state_tensors: the named tensors of
        each State layer's state, {name: (shape, dtype)} for every State layer or {layer: {name:
        (shape, dtype)}} per layer (numeric numpy dtypes or "bfloat16"; each tensor 16-byte aligned
        in a slot); the pool keeps rows(layer) slots of them per State layer (docs/layer_kinds.md).
        InvalidArgumentError: another dtype or cache None, a compute_dtype other than those (or, for
        a plain dtype, other than it), state_tensors missing for a State layer, naming a layer that
        is not one, an empty name, a dim < 1, another dtype or a slot that overflows;
        AllocationError when memory runs out (at construction or on growth).
        """
    @property
    def cache(self) -> SequenceCache:
        """The SequenceCache whose plans this pool applies (kept alive by it)."""
    @property
    def mirror_rings(self) -> bool:
        """True when wrapping ring layers keep a mirror of their first R - 1 rows,
        so every read without sinks is a zero-copy view."""
    @property
    def dtype(self) -> np.dtype[Any] | str:
        """Storage format: the numpy dtype of every stored element, or 'qint8' / 'fp8_e4m3' for
        quantized rows (docs/quantized.md).
        """
    @property
    def compute_dtype(self) -> np.dtype[Any]:
        """numpy dtype that write/update take and read/update return (a plain pool's dtype; float32,
        float16 or bfloat16 for a quantized one).
        """
    @property
    def n_layers(self) -> int:
        """Number of layers, as the cache's."""
    @property
    def nbytes(self) -> int:
        """Bytes of the rows holding the cache's committed positions (a State layer's: min(length,
        D) slots; a Shared layer's: none).
        """
    @property
    def reserved_bytes(self) -> int:
        """Bytes of storage allocated now."""
    def rows(self, layer: SupportsIndex) -> int:
        """Rows `layer` holds at most (the cache's rows(layer)). InvalidArgumentError: bad layer."""
    def allocated_rows(self, layer: SupportsIndex) -> int:
        """Rows `layer` has storage for now (it doubles up to rows(layer) when a write reaches
        further). InvalidArgumentError: bad layer.
        """
    def reserve(self, layer: SupportsIndex, rows: SupportsIndex) -> None:
        """Grows `layer`'s storage now to at least `rows` rows, so later writes below it never
        allocate. InvalidArgumentError: bad layer, rows outside [0, rows(layer)]; AllocationError:
        the growth failed (nothing changed).
        """
    def export_size(self, n_tokens: SupportsIndex = 0) -> int:
        """Bytes export_sequence() gives for the cache's sequence with `n_tokens` known token ids.
        InvalidArgumentError: n_tokens outside [0, length].
        """
    def export_sequence(self, tokens: _Tokens | None = None) -> bytes:
        """The cache's sequence as a record (bytes, docs/state.md): length, per layer the rows its
        layer still holds (a ring's sinks and window, not what it released; a Shared layer none; a
        State layer its states after positions [held_from, length): the last one and the run of held
        states before it, what a rewind needs; record version 3) and `tokens` (the ids of positions
        [0, len(tokens)), optional: a 1-D int32 or int64 array or a list of ints, copied; never cast
        from floats, bools or strings). InvalidArgumentError: more tokens than the length, tokens of
        another dtype or shape, an id beyond 32 bits; TypeError: a list item that is not an int;
        InvalidStateError: a step is begun.
        """
    def export_into(self, out: _WritableBuffer, tokens: _Tokens | None = None) -> int:
        """Writes the record export_sequence() gives into the first bytes of the buffer `out`
        (writable, C-contiguous, 8-byte aligned, at least export_size() bytes, e.g. a numpy uint8
        array) and returns its size in bytes. InvalidArgumentError: out not a buffer, read-only, not
        C-contiguous (a strided, negative-stride, stride-0 or Fortran-ordered view), misaligned or
        too small, checked before anything is written; errors as export_sequence.
        """
    def import_sequence(self, record: _Buffer) -> None:
        """Admits the sequence of `record` (any bytes-like object) into the empty cache and this
        pool: its length, rows and states; every later plan and read equals the exporter's, and
        can_rewind allows what the record carries (never more than the exporter). Checks everything
        first and changes nothing on an error. InvalidArgumentError: truncated, corrupt (checksum),
        bad magic, or a policy, shape or dtype other than the cache's (a State layer: D or the bytes
        of its state tensors); NotSupportedError: a newer record version, or a record with holes or
        a removed head; InvalidStateError: the cache holds positions or a begun step; CapacityError:
        its length exceeds the capacity.
        """
    def write(
        self, layer: SupportsIndex, plan: SeqStepPlan, k: npt.NDArray[Any], v: npt.NDArray[Any]
    ) -> None:
        """Writes the step's rows: k (T, n_kv_heads, head_dim) and v (T, n_kv_heads, value_dim),
        C-contiguous, of the pool's dtype, go where `plan` (layer's plan of the begun step) says;
        input row j is position P + j (a tree step's: token j, written to the row of its
        chain_index). InvalidArgumentError: bad layer or arrays; InvalidStateError: a stale plan;
        AllocationError: growth failed. Nothing is written on any error.
        """
    def read(
        self, layer: SupportsIndex, plan: SeqStepPlan, *, order: str = "rows"
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[np.int64]]:
        """(k, v, positions) of `plan`'s step after its rows were written. order='rows' (the
        default): every held row as it lies, one zero-copy read-only view, positions[r] the position
        row r stands for (mask with step.mask(layer)); order='positions': the plan's read in
        increasing positions, a view when it is one run, else a gathered copy. InvalidArgumentError:
        bad layer or order; InvalidStateError: a stale plan or rows not written yet. A quantized
        pool returns the rows dequantized into compute_dtype, in a workspace the next read of any
        layer reuses (copy what must outlive it).
        """
    def read_quantized(self, layer: SupportsIndex, plan: SeqStepPlan) -> dict[str, npt.NDArray[Any] | None]:
        """The raw quantized rows of `plan`'s step in row order (as read(order='rows')), zero-copy
        and read-only: a dict of k, v (int8 values for 'qint8'; uint8 bytes of float8 e4m3fn for
        'fp8_e4m3', view them with ml_dtypes.float8_e4m3fn), k_scales, v_scales (float32, (rows,
        n_kv_heads)), k_zero_points, v_zero_points (int8, (rows, n_kv_heads); None for fp8) and
        positions. InvalidArgumentError: bad layer, a pool that is not quantized; InvalidStateError:
        a stale plan or rows not written yet.
        """
    def update(
        self, layer: SupportsIndex, step: Step, k: npt.NDArray[Any], v: npt.NDArray[Any], *, order: str = "rows"
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[np.int64]]:
        """write then read in one call, the per-layer hot path: writes k/v (T rows) for the begun
        `step` and returns (k, v, positions) as read(layer, plan, order=order). Errors as write and
        read; InvalidStateError: `step` is stale or of another cache. A tree step (begin_tree)
        writes token i to the row of its chain_index and its positions give each row's token
        position (length + depth); mask with step.mask(layer, order=order). A Shared layer is
        refused naming its source (update the source, then read the Shared layer: its source's
        rows); a State layer is refused (write_state, read_state).
        """
    def state_names(self, layer: SupportsIndex) -> list[str]:
        """The names of State layer `layer`'s state tensors, in the order state_tensors gave them.
        InvalidArgumentError: bad layer, a layer that is not a State layer.
        """
    def write_state(self, layer: SupportsIndex, step: Step, states: Mapping[str, npt.NDArray[Any]]) -> None:
        """Stores the states the begun `step` produces on State layer `layer`: states[name] is an
        array (n, *shape) of the tensor's dtype, C-contiguous, for every tensor of the layer, row j
        the state after the j-th position the step keeps: n = step.plan(layer).write_len, T for a
        verify step (begin_step(T, verify=True)), 1 (the last position's) for any other chain step,
        N for a tree step (row i: node i's). Every name, shape and dtype is checked before anything
        is written. InvalidArgumentError: bad layer, not a State layer, a missing or unknown name,
        another shape or dtype, not C-contiguous; InvalidStateError: `step` is stale or of another
        cache.
        """
    def read_state(
        self, layer: SupportsIndex, step: Step, *, node: SupportsIndex | None = None
    ) -> dict[str, npt.NDArray[Any]]:
        """The state the begun `step` starts from on State layer `layer`, as a dict name ->
        read-only array of the tensor's shape (a copy): the state after position P - 1, zeros at P =
        0. Read it before write_state (a step without verify may write its last state into that
        slot). node=i (a tree step): the state tree node i starts from, its parent's (write_state
        the tree first), the root's being the step's. InvalidArgumentError: bad layer, not a State
        layer, node outside [0, N) or given for a chain step; InvalidStateError: `step` is stale or
        of another cache.
        """
    def state_slots(self, layer: SupportsIndex, name: str) -> npt.NDArray[Any]:
        """Read-only zero-copy array (D, *shape) of tensor `name` in every slot of State layer
        `layer` (D = rows(layer)), for kernels that index slots themselves (vLLM-style
        state_indices: step.plan(layer).read names the slot a step starts from, its write runs the
        slots it fills). InvalidArgumentError: bad layer, not a State layer, no such tensor.
        """
    def apply_copies(self, copies: Sequence[npt.NDArray[np.integer[Any]]]) -> None:
        """Performs a draft-tree commit's row copies: `copies` is what SequenceCache.commit(step,
        accepted) returned, one int (n, 2) array [src row, dst row] per layer (a State layer's:
        state slots), copied in order. Call it after the commit and before writing the next step.
        InvalidArgumentError: not one (n, 2) array per layer, or a row outside the layer;
        InvalidStateError: a row the tree step never wrote. Every layer is checked before anything
        is copied.
        """
    @staticmethod
    def required_bytes(
        config: CacheConfig,
        dtype: npt.DTypeLike,
        *,
        mirror_rings: bool = False,
        state_tensors: _StateTensors | None = None,
    ) -> int:
        """Bytes one arena must have for a pool of a cache built from `config` in `dtype`, as the
        C++ KVPool::in_arena takes them: every layer at its full rows(layer) for K and V (with
        mirror_rings, plus the R - 1 mirror rows of each wrapping ring layer without sinks), the
        layer table and each K and V block rounded up to 64 bytes, and 63 bytes of slack to align
        the start, so any address works; each State layer's D slots of its state_tensors (as KVPool
        takes them). Builds no pool. InvalidArgumentError: `config` breaks a CacheConfig rule,
        another dtype, bad state_tensors (as KVPool), or the total overflows the address space.
        """
    def __deepcopy__(self, memo: dict[int, Any]) -> KVPool:
        """An independent pool holding a copy of every row and state slot, over a deep copy of its
        cache (shared with other objects of the same deepcopy). AllocationError when it cannot be
        allocated.
        """

# --- batch.cpp -------------------------------------------------------------------

class SequenceInfo(metaclass=_pybind11_type):
    """One sequence of a BatchCache, as the runner sees it: a copy, taken when cache.sequence(seq)
    was called.
    """

    @property
    def active(self) -> bool:
        """False until add_sequence() or fork() (and after release_sequence())."""
    @property
    def length(self) -> int:
        """Committed length L: the next step writes positions L, L + 1, ..."""
    @property
    def visible_start(self) -> int:
        """Positions below it were removed (remove(seq, 0, p1))."""
    @property
    def holes(self) -> list[tuple[int, int]]:
        """Removed middle ranges [(begin, end), ...], sorted."""
    @property
    def visible_positions(self) -> int:
        """Positions [0, length) not removed: what the sequence still sees."""

class GroupPlan(metaclass=_pybind11_type):
    """One group's part of a BatchStepPlan (a group: the layers sharing a policy and a block pool).
    Arrays are read-only int32 views of the cache's buffers; reading one after the step ended raises
    InvalidStateError.
    """

    @property
    def group(self) -> int:
        """The group's index."""
    @property
    def slots(self) -> npt.NDArray[np.int32]:
        """(n_tokens,) physical row of each new token (block * block_size + offset), in token order:
        where to write (slot_mapping).
        """
    @property
    def copies(self) -> npt.NDArray[np.int32]:
        """(n_copies, 2) blocks to copy, (src, dst), all block_size rows, before writing
        (copy-on-write of a shared, partly filled block).
        """
    @property
    def block_tables(self) -> npt.NDArray[np.int32]:
        """(max_active_seqs, table_stride) block of each block index, one row per active sequence,
        -1 for a hole; entry i reads row table_rows[seq_ids[i]] of the plan (row seq_ids[i] when
        max_active_seqs == max_seqs), its first ceil(context_lens[i] / block_size) entries. A
        zero-copy view of unpaged tables; NotSupportedError when the tables are paged
        (batch.table_page_blocks > 0: entry_tables reads either layout).
        """
    @property
    def entry_tables(self) -> npt.NDArray[np.int32]:
        """(n_entries, max over entries of ceil(context_lens[i] / block_size)) int32: row i is entry
        i's block table (the block of each block index, -1 for a hole), its first
        ceil(context_lens[i] / block_size) entries, -1 past them: flash-attn's and vLLM's
        block_table for the step. A copy (O(the step's blocks)), made from either table layout,
        paged or not.
        """
    @property
    def table_pages(self) -> npt.NDArray[np.int32]:
        """(table_pages, page_blocks) the pages every group's rows live in (-1 entries: no block).
        Row r's block index j is table_pages[table_dir[r, j // page_blocks], j % page_blocks] (a
        page id of -1: every entry -1). Unpaged, a row is one page of table_stride entries. A
        zero-copy view.
        """
    @property
    def table_dir(self) -> npt.NDArray[np.int32]:
        """(max_active_seqs, ceil(table_stride / page_blocks)) the page ids of each row of this
        group (table_rows names a sequence's row), -1 for a page the row holds no block in. A
        zero-copy view.
        """
    @property
    def policy(self) -> LayerPolicy:
        """The group's LayerPolicy: the window bounds of the visibility rule (a ring's window and
        sinks in positions; Flat: every earlier position).
        """

class StateGroupPlan(metaclass=_pybind11_type):
    """One State group's part of a BatchStepPlan (docs/batch.md section 10: the State layers keeping
    D state slots per sequence). Slots are physical state slot indices in [0, num_slots), the
    state_indices a recurrent kernel takes (layer l of the group keeps state i at state[l][i]), -1
    for none. Arrays are read-only int32 views of the cache's buffers, one value per token of the
    step in token order (as GroupPlan.slots); reading one after the step ended raises
    InvalidStateError.
    """

    @property
    def state_group(self) -> int:
        """The State group's index (cache.state_group_of(layer))."""
    @property
    def read_slots(self) -> npt.NDArray[np.int32]:
        """(n_tokens,) the physical slot holding the state token j starts from: for an entry's first
        token (a tree's root) the state after position first - 1, -1 at position 0 (zeros); for a
        tree node its parent's write slot; for a chain token j > 0 the previous token's write slot,
        or -1 when the step does not keep it (the state carried within the forward).
        """
    @property
    def write_slots(self) -> npt.NDArray[np.int32]:
        """(n_tokens,) the physical slot where token j's state (the state after its position) is
        written, -1 when the step does not keep it: a chain entry without verify keeps only its last
        token's; a verify entry or a tree keeps every token's (tree node j in the slot of position
        first + chain_index[j], as a chain would). No slot one entry reads is written by another
        entry of the step.
        """
    @property
    def slots_per_seq(self) -> int:
        """D: the logical state slots each sequence keeps (the policy's slots)."""
    @property
    def num_slots(self) -> int:
        """Physical slots of the group (cache.num_state_slots): every slot named is below it."""
    @property
    def policy(self) -> LayerPolicy:
        """The group's State LayerPolicy (its slots: D)."""

class BatchStepPlan(metaclass=_pybind11_type):
    """The plan of a begun BatchStep in the varlen paged format. Per-entry arrays are read-only
    int32 views of the cache's buffers; entry i's queries are tokens [query_starts[i],
    query_starts[i+1]) at positions first_positions[i] + j. Reading an array after the step ended
    raises InvalidStateError.
    """

    @property
    def n_entries(self) -> int:
        """Sequences in the step."""
    @property
    def n_tokens(self) -> int:
        """New tokens of the step, all sequences."""
    @property
    def block_size(self) -> int:
        """Rows per block."""
    @property
    def seq_ids(self) -> npt.NDArray[np.int32]:
        """(n_entries,) the sequence of each entry."""
    def arrays(
        self,
    ) -> tuple[
        npt.NDArray[np.int32],
        npt.NDArray[np.int32],
        npt.NDArray[np.int32],
        npt.NDArray[np.int32],
        npt.NDArray[np.int32],
        npt.NDArray[np.int32],
        tuple[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32] | None], ...],
    ]:
        """Every array of the plan in one call, as the properties give them (the same read-only
        views of the cache's buffers, no copy): (seq_ids, query_starts, first_positions,
        context_lens, visible_starts, table_rows, groups), groups holding (slots, copies,
        block_tables) per group, block_tables None when the tables are paged (GroupPlan.entry_tables
        reads them). One call instead of a property read per array: what a backend reads every step.
        InvalidStateError: the step ended.
        """
    @property
    def table_rows(self) -> npt.NDArray[np.int32]:
        """(max_seqs,) each sequence id's row in every group's block_tables: an active sequence's
        row (its id when max_active_seqs == max_seqs), -1 for an inactive one whatever
        max_active_seqs.
        """
    @property
    def query_starts(self) -> npt.NDArray[np.int32]:
        """(n_entries + 1,) entry i's tokens are [query_starts[i], query_starts[i + 1])
        (cu_seqlens_q).
        """
    @property
    def first_positions(self) -> npt.NDArray[np.int32]:
        """(n_entries,) each sequence's length before the step: its first new position."""
    @property
    def context_lens(self) -> npt.NDArray[np.int32]:
        """(n_entries,) each sequence's length after the step (cache_seqlens)."""
    @property
    def visible_starts(self) -> npt.NDArray[np.int32]:
        """(n_entries,) positions below it were removed from the sequence: never visible."""
    def holes(self, entry: SupportsIndex) -> list[tuple[int, int]]:
        """Entry i's removed middle ranges [(begin, end), ...] of positions: never visible.
        InvalidArgumentError: entry outside [0, n_entries). InvalidStateError: the step ended.
        """
    def mask(self, group: SupportsIndex, rows: SupportsIndex | None = None) -> npt.NDArray[np.bool_]:
        """Boolean (n_tokens, rows) mask over the group's pool rows [0, rows) (default:
        used_blocks(group) * block_size, every live row): mask[t, r] is True when new token t may
        see the key in row r (its own sequence's, by the visibility rule, not removed; a tree node
        sees its history by the rule at its position and, of its tree, itself and its ancestors
        within the window). A new array. InvalidArgumentError: bad group or rows.
        """
    @property
    def positions(self) -> npt.NDArray[np.int32]:
        """(n_tokens,) the position of each new token: first_positions[i] + j for a chain,
        first_positions[i] + depth(node) for a draft tree's node (RoPE and the mask use it).
        """
    @property
    def chain_index(self) -> npt.NDArray[np.int32]:
        """(n_tokens,) each token's place among its entry's reserved positions: a tree entry of N
        nodes takes the rows of positions [first, first + N) as a chain of N would, node j the row
        of position first + chain_index[j] in the block table (the main line in place). j for a
        chain.
        """
    @property
    def tree_mask_starts(self) -> npt.NDArray[np.int32]:
        """(n_entries + 1,) entry i's ancestor mask is
        tree_masks[tree_mask_starts[i]:tree_mask_starts[i + 1]] (uint32 words); an empty range: a
        chain (causal).
        """
    @property
    def tree_masks(self) -> npt.NDArray[np.uint32]:
        """uint32 words of every tree entry's packed ancestor mask, entry after entry: N rows of
        ceil(N / 32) words, row j bit k (word k // 32, bit k % 32) set when node k is j or an
        ancestor of j (TensorRT-LLM's packed mask; each row's bytes are FlashInfer's
        packbits(bitorder='little')).
        """
    def is_tree(self, entry: SupportsIndex) -> bool:
        """True when entry i is a draft tree (not a chain). InvalidArgumentError: entry outside [0,
        n_entries). InvalidStateError: the step ended.
        """
    @property
    def groups(self) -> tuple[GroupPlan, ...]:
        """One GroupPlan per group (index with cache.group_of(layer))."""
    @property
    def n_state_groups(self) -> int:
        """State groups of the cache (0 without State layers)."""
    @property
    def state_groups(self) -> tuple[StateGroupPlan, ...]:
        """One StateGroupPlan per State group (index with cache.state_group_of(layer)); empty
        without State layers. InvalidStateError: the step ended.
        """
    def state_arrays(self) -> tuple[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]], ...]:
        """Every State group's arrays in one call: a tuple of (read_slots, write_slots) per State
        group, the same read-only int32 (n_tokens,) views StateGroupPlan gives (physical state slots
        per token, -1 for none). Empty without State layers. InvalidStateError: the step ended.
        """

# (seq, T), (seq, T, tokens) or (seq, T, tokens, parents): tokens any iterable of T ids (a list,
# a numpy array), or None; parents T ints making the tokens a draft tree, or None.
StepEntryArg = (
    tuple[SupportsIndex, SupportsIndex]
    | tuple[SupportsIndex, SupportsIndex, Iterable[SupportsIndex] | None]
    | tuple[SupportsIndex, SupportsIndex, Iterable[SupportsIndex] | None, Iterable[SupportsIndex] | None]
)

# commit(step, accepted=...): {seq: nodes} or [(seq, nodes), ...], nodes a root path of node ids.
AcceptedArg = Mapping[int, Iterable[SupportsIndex]] | Iterable[tuple[SupportsIndex, Iterable[SupportsIndex]]]


class BatchStep(metaclass=_pybind11_type):
    """A begun step of a BatchCache. As a context manager it commits on normal exit and leaves the
    step uncommitted when the body raises.
    """

    @property
    def n_entries(self) -> int:
        """Sequences in the step."""
    @property
    def n_tokens(self) -> int:
        """New tokens in the step, all sequences."""
    @property
    def is_current(self) -> bool:
        """True while this is the cache's begun, uncommitted step."""
    def plan(self) -> BatchStepPlan:
        """The step's BatchStepPlan. InvalidStateError: the step is no longer the begun one."""
    @overload
    def commit(self, accepted: None = None) -> None:
        """Commits the step: as cache.commit(step, accepted). InvalidStateError: stale step.
        InvalidArgumentError: see cache.commit.
        """
    @overload
    def commit(self, accepted: AcceptedArg) -> tuple[npt.NDArray[np.int32], ...]:
        ...
    def abort(self) -> None:
        """Ends the step without committing it: every length, block table and count is as
        before the step began (its blocks return to the pools). InvalidStateError: stale
        step; nothing changes."""
    def __enter__(self) -> BatchStep: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]: ...

class BatchCache(CacheBase, metaclass=_pybind11_type):
    """Many sequences over paged block pools (docs/design.md section 6): one pool of blocks per
    group of layers sharing a policy; forks share blocks, removals and rewinds release them, ring
    groups release what no future query can reach, and full blocks named by their token ids are
    reused by new sequences with the same prefix. Sequence ids are 0..max_seqs-1; every table is
    sized from config.batch (BatchLimits) at creation. A failing call raises and changes nothing.
    """

    def __init__(self, config: CacheConfig) -> None:
        """Builds the cache. InvalidArgumentError names a bad config or BatchLimits field;
        AllocationError when its tables cannot be allocated.
        """
    @property
    def max_seqs(self) -> int:
        """Sequence ids are 0..max_seqs-1."""
    @property
    def capacity(self) -> int:
        """Largest length of one sequence (positions)."""
    @property
    def max_step(self) -> int:
        """Largest T of one sequence in one step."""
    @property
    def max_rewind(self) -> int:
        """Longest rewind, in positions, ring and chunked groups keep history for: can_rewind(s, n)
        holds for n >= the longest length s committed minus this (batch.max_rewind, default max_step).
        """
    @property
    def max_step_tokens(self) -> int:
        """Largest number of new tokens of one step."""
    @property
    def n_layers(self) -> int:
        """Number of layers (config.n_layers), in n_groups groups."""
    @property
    def n_groups(self) -> int:
        """Groups: layers sharing one policy and one block pool."""
    @property
    def block_size(self) -> int:
        """Rows per block."""
    @property
    def state_block_size(self) -> int:
        """The State groups' block, in tokens (batch.state_block_size, 0 resolved to block_size): a
        commit names the state at its end only at a length that is a multiple of it, so prefix hits
        on State layers land there.
        """
    @property
    def table_stride(self) -> int:
        """Block table entries per row: ceil(capacity / block_size)."""
    @property
    def max_active_seqs(self) -> int:
        """Sequences active at once (BatchLimits.max_active_seqs, default max_seqs): the rows of
        each group's block tables.
        """
    @property
    def table_page_blocks(self) -> int:
        """Block table entries per table page: batch.table_page_blocks, or table_stride when the
        tables are unpaged (a row is one page).
        """
    @property
    def table_pages(self) -> int:
        """Table pages every group draws from (unpaged: one per row and group, each a row's)."""
    @property
    def free_table_pages(self) -> int:
        """Table pages no row holds (0 when unpaged). A step is admitted when its entries'
        table_pages_needed sum to at most this.
        """
    @property
    def free_table_rows(self) -> int:
        """Sequences that may still become active (add_sequence, fork into an inactive one) before
        one is refused with CapacityError: max_active_seqs less the active sequences (also when
        max_active_seqs == max_seqs).
        """
    def group_of(self, layer: SupportsIndex) -> int:
        """The group of a layer. InvalidArgumentError: bad layer, or a State layer (it has no block
        group: state_group_of names its State group).
        """
    @property
    def n_state_groups(self) -> int:
        """State groups: the State layers (recurrent state, docs/batch.md section 10) of one policy,
        apart from the n_groups block groups. 0 without State layers.
        """
    def state_group_of(self, layer: SupportsIndex) -> int:
        """The State group of a State layer, in [0, n_state_groups): index plan.state_groups and the
        State part of commit's copies with it. InvalidArgumentError: bad layer, or a layer that is
        not a State layer (the message names it; group_of names its block group).
        """
    def state_group_policy(self, state_group: SupportsIndex) -> LayerPolicy:
        """The State policy of a State group's layers: its .slots is D, the logical state slots each
        sequence keeps (position p's state in slot p % D; a verify step needs T <= D - 1).
        InvalidArgumentError: state_group outside [0, n_state_groups).
        """
    def num_state_slots(self, state_group: SupportsIndex) -> int:
        """Physical state slots of a State group (max_active_seqs * D + min(max_step_tokens,
        max_active_seqs * D) + batch.state_snapshots): every slot a plan or commit names is below it, and a byte layer of
        the group keeps this many states (state[l][slot]). InvalidArgumentError: state_group outside
        [0, n_state_groups).
        """
    def state_snapshots(self, state_group: SupportsIndex) -> int:
        """Named state snapshots a State group keeps now, at most batch.state_snapshots: a committed
        step whose length ends a full block of known tokens names the state after it, and
        adopt_prefix starts a prompt with that prefix from it (docs/batch.md section 10).
        InvalidArgumentError: state_group outside [0, n_state_groups).
        """
    def group_policy(self, group: SupportsIndex) -> LayerPolicy:
        """The policy of a group's layers. InvalidArgumentError: bad group."""
    def layer_config(self, layer: SupportsIndex) -> LayerConfig:
        """A layer's policy and row shape. InvalidArgumentError: bad layer."""
    def num_blocks(self, group: SupportsIndex) -> int:
        """Blocks of the one pool every group draws from (the same for every group; a layer's rows:
        num_blocks * block_size). InvalidArgumentError: group outside [0, n_groups).
        """
    def used_blocks(self, group: SupportsIndex) -> int:
        """One past the highest block of the one pool any sequence holds (the same for every group):
        every live row lies in rows [0, used_blocks * block_size) (allocation takes the lowest free
        block). InvalidArgumentError: group outside [0, n_groups).
        """
    def held_blocks(self, group: SupportsIndex) -> int:
        """Blocks of the one pool the group's sequences hold now: how the budget splits between the
        groups (the sum over groups is num_blocks - free_blocks). InvalidArgumentError: group
        outside [0, n_groups).
        """
    def storage_layer(self, layer: SupportsIndex) -> int:
        """The layer whose storage this layer's K/V rows may share: group g's j-th K/V layer shares
        with the first layer that is any group's j-th (the groups draw their blocks from one pool, so
        a block is one page of those layers' memory whichever group holds it); a byte layer shares
        when the rows have one size. Shared and State layers: themselves. InvalidArgumentError: bad
        layer.
        """
    def free_blocks(self, group: SupportsIndex) -> int:
        """Blocks of the one pool no sequence holds (reclaimable cached ones included; the same for
        every group). InvalidArgumentError: group outside [0, n_groups).
        """
    def table_pages_needed(self, seq: SupportsIndex, T: SupportsIndex) -> int:
        """The table pages a step entry of T tokens of seq takes over every group (paged tables: the
        pages its rows lack for the block indices it writes; 0 unpaged): begin_step admits a step
        when its entries' sum is at most free_table_pages. Changes nothing. InvalidArgumentError:
        seq outside [0, max_seqs), T outside [1, max_step]; InvalidStateError: seq not active;
        CapacityError: length + T > capacity.
        """
    @overload
    def blocks_needed(self, seq: int | np.integer[Any], T: int | np.integer[Any]) -> list[int]:
        """The blocks a step entry of T tokens of seq takes in each group (new blocks, and private
        copies of blocks other sequences hold or that are named), a list of n_groups ints, as
        begin_step counts them: begin_step admits a step when its entries' sum over every group is
        at most free_blocks (plus what a begun step it replaces took), so requests admitted one by
        one can add their needs up and begin the step once. Array form: seq and T 1-D int arrays
        (or lists) of one length n, the entries of a step a scheduler weighs (each counted alone,
        as begin_step adds them up): an int32 array (n, n_groups), one call instead of n. Changes
        nothing. InvalidArgumentError: seq outside [0, max_seqs), T outside [1, max_step], seq and
        T not both ints or both arrays of one length; InvalidStateError: seq not active;
        CapacityError: length + T > capacity (the array form's message names the entry).
        """
    @overload
    def blocks_needed(self, seq: IntArrayArg, T: IntArrayArg) -> npt.NDArray[np.int32]:
        ...
    def state_blocks_needed(self, seq: SupportsIndex, T: SupportsIndex, verify: bool | int = False) -> int:
        """With batch.states_in_pool, the pool's blocks a step entry of T tokens of seq takes for its
        states in every State group, as begin_step counts them (one per state kept: every token's
        with verify, else the last, whose logical slot names no physical slot, a shared or a named
        one); 0 without. begin_step admits a step when its entries' blocks_needed over every group
        plus these fit the pool's free blocks. Changes nothing. InvalidArgumentError: seq outside
        [0, max_seqs), T outside [1, max_step], verify not a bool (or 0 / 1, as begin_step takes
        it), a verify entry of T > D - 1; InvalidStateError: seq not active; CapacityError: length
        + T > capacity.
        """
    def cached_blocks(self, group: SupportsIndex) -> int:
        """Free blocks of the group that still hold a reusable prefix (reclaimed least recently
        released first, whatever their group). InvalidArgumentError: group outside [0, n_groups).
        """
    def blocks_held(self, seq: SupportsIndex, group: SupportsIndex) -> int:
        """Blocks of a group the sequence holds (0 for an inactive one), shared ones included.
        InvalidArgumentError: seq outside [0, max_seqs) or group outside [0, n_groups).
        """
    def oldest_held(self, seq: SupportsIndex, group: SupportsIndex) -> int:
        """The oldest position whose block the group still holds for the sequence (its length in
        positions when it holds none). InvalidArgumentError: seq outside [0, max_seqs) or group
        outside [0, n_groups).
        """
    def block_table(self, seq: SupportsIndex, group: SupportsIndex) -> npt.NDArray[np.int32]:
        """block_table(seq, group) -> int32 (ceil(length / block_size),): the block id holding each
        block of the sequence's committed positions in the group's pool, by block index (block i
        holds positions [i * block_size, (i + 1) * block_size), its rows [id * block_size, (id + 1)
        * block_size) of every layer of the group); -1 for a block the group released or never kept
        (a ring's passed window, a removed range). A new array (a copy: later verbs do not change
        it); empty for an inactive sequence. Between steps it names where the rows lie; during a
        begun step it already names the step's copy-on-write destinations. InvalidArgumentError: seq
        outside [0, max_seqs) or group outside [0, n_groups).
        """
    def sequence(self, seq: SupportsIndex) -> SequenceInfo:
        """The sequence's SequenceInfo. InvalidArgumentError: seq out of range."""
    def length(self, seq: SupportsIndex) -> int:
        """The sequence's committed length in positions (0 for an inactive one).
        InvalidArgumentError: seq outside [0, max_seqs).
        """
    def add_sequence(self, seq: SupportsIndex, namespace: int | bytes | str | None = None) -> None:
        """Starts an empty sequence (length 0) in prefix namespace `namespace`: None (the default
        namespace, 0), an int in [0, 2**64), or bytes / str hashed once (BLAKE2b, 8 bytes). Its full
        blocks are named, and its adopt_prefix looks prompts up, in that namespace only: give
        requests whose K/V differ for equal tokens (a tenant, LoRA adapter, model revision,
        multimodal input) their own. Forks inherit it. InvalidArgumentError: seq outside [0,
        max_seqs), a bad namespace. InvalidStateError: it is already active. CapacityError:
        max_active_seqs sequences are active (no table row is free).
        """
    def release_sequence(self, seq: SupportsIndex) -> None:
        """Ends a sequence and releases its blocks. InvalidArgumentError: seq outside [0, max_seqs).
        InvalidStateError: it is not active.
        """
    def release_named_state(self, seq: SupportsIndex) -> int:
        """With batch.states_in_pool, seq stops holding the latest state it named in each
        State group, which it holds beyond its logical slots so that the state leaves with
        the blocks it ends. The state stays named (lookups still find it) and is cached,
        counted free and reclaimed least recently released first, once nothing else holds
        it; seq holds the next state it names. A scheduler short of blocks calls it before
        it preempts a sequence: a later hit traded for a running request. Returns the blocks
        it made free (0 without states in the pool). Ends a begun step, as every sequence
        verb does. InvalidArgumentError: seq outside [0, max_seqs). InvalidStateError: it is
        not active.
        """
    def fork(self, src: SupportsIndex, dst: SupportsIndex, upto: SupportsIndex | None = None) -> None:
        """dst inherits positions [0, upto) of src (default: all) by sharing blocks, copying no K/V.
        InvalidArgumentError: bad ids or upto. InvalidStateError: src not active, dst not empty, or
        src no longer holds what a query of dst at upto needs. CapacityError: dst is inactive and
        max_active_seqs sequences are active.
        """
    def remove(self, seq: SupportsIndex, p0: SupportsIndex, p1: SupportsIndex | None = None) -> None:
        """Positions [p0, p1) leave the sequence's history: it never sees them again; its length and
        positions do not change. A middle range becomes a hole, a head range moves visible_start; p0
        < length <= p1 (or p1 = None) is a truncation, rewind(seq, p0); p0 >= length or p0 == p1
        removes nothing: a successful no-op (llama.cpp's seq_rm), where rewind refuses p0 > length.
        InvalidArgumentError: seq outside [0, max_seqs), p0 < 0 or p1 < p0. InvalidStateError: seq
        not active, or a truncation that breaks the rewind rule (a ring group released history a
        query at p0 needs). CapacityError: the sequence would keep more than max_holes separate
        removed middle ranges.
        """
    def rewind(self, seq: SupportsIndex, n: SupportsIndex) -> None:
        """length(seq) = n (positions); the sequence's blocks from index ceil(n / block_size) on are
        released. InvalidArgumentError: seq outside [0, max_seqs), n outside [0, length(seq)].
        InvalidStateError: seq not active, or a ring group released history a query at n needs
        (can_rewind tells first).
        """
    def can_rewind(self, seq: SupportsIndex, n: SupportsIndex) -> bool:
        """True exactly when rewind(seq, n) would succeed. Never raises."""
    def prefix_namespace(self, seq: SupportsIndex) -> int:
        """The 64-bit prefix namespace the sequence names its blocks in (0: the default; 0 once
        released). InvalidArgumentError: seq outside [0, max_seqs).
        """
    def adopt_prefix(
        self, seq: SupportsIndex, tokens: Iterable[SupportsIndex], namespace: int | bytes | str | None = None
    ) -> int:
        """An empty active sequence adopts the longest cached prefix of `tokens` (a 1-D int32 or
        int64 array, or an ordered iterable of ints, not a set or dict; copied once) (full blocks,
        at most len(tokens) - 1 tokens) every group holds, in the sequence's prefix namespace;
        returns its length in positions, a multiple of block_size (0: a miss), which becomes the
        sequence's length. `namespace` (None: keep the sequence's, as add_sequence gave it) sets the
        namespace first (as add_sequence's). InvalidArgumentError: seq outside [0, max_seqs),
        len(tokens) > capacity, a bad namespace. InvalidStateError: seq not active, or not empty
        (length > 0).
        """
    def begin_step(
        self,
        entries: Iterable[StepEntryArg] | IntArrayArg,
        T: SupportsIndex | IntArrayArg | None = None,
        tokens: IntArrayArg | None = None,
        token_offsets: IntArrayArg | None = None,
        parents: IntArrayArg | None = None,
        *,
        verify: bool | Iterable[bool] = False,
    ) -> BatchStep:
        """Begins one forward; replaces an uncommitted step. Two forms: begin_step(entries): entries
        [(seq, T), (seq, T, tokens) or (seq, T, tokens, parents), ...] (tokens: T ids, for prefix
        reuse, or None; parents: T ints making the tokens a draft tree of N = T nodes, parents[0] =
        -1 and 0 <= parents[i] < i, node i at position length + depth(i)), laid out entry after
        entry. begin_step(seqs, T, tokens=None, token_offsets=None, parents=None): the same as
        arrays, with no Python object per entry: seqs the sequence of each entry; T one int for all
        or one per entry; tokens the step's ids flat, entry after entry (sum(T) of them), or with
        token_offsets (n + 1 values from 0 to len(tokens), non-decreasing) entry i's are
        tokens[token_offsets[i]:token_offsets[i + 1]], T[i] of them or none. Arrays: int32 or int64,
        1-D, contiguous (numpy, array.array, a CPU torch tensor through DLPack) or lists of ints;
        int32 tokens are read in place. parents (arrays): the entries' trees flat like the tokens
        (by token_offsets when given: T[i] values or none, a chain; else T[i] each). verify
        (keyword, either form): True makes every entry a verify step, one that may be rewound into
        (speculative decoding): the State groups keep the state after each of its positions (needs T
        <= D - 1, D = state_group_policy(k).slots); False (the default) keeps only each entry's
        last. Or one bool per entry, in entry order (a list, a numpy bool array). A tree keeps every
        node's state anyway; models without State layers ignore it. T is the sequence's new tokens
        (positions) in this step. InvalidArgumentError: no entries or more than max_seqs, an entry
        not as above, seq outside [0, max_seqs), a sequence twice, T outside [1, max_step], more
        than max_step_tokens tokens in all, len(tokens) != T, parents not a tree in topological
        order (parents[0] != -1, a second root, parents[i] outside [0, i)) or not T of them; an
        array of another dtype, ndim or length, not contiguous, a value beyond 32 bits,
        token_offsets not as above; verify neither a bool nor one bool per entry (the message names
        the value), a verify entry with T > D - 1 of a State group. InvalidStateError: a sequence
        not active, or a State group no longer holds the state after length - 1 (an aborted step of
        T = k * D without verify: rewind first). CapacityError: length + T would pass capacity
        (positions), or a group's pool has fewer free blocks than the step needs. TypeError: entries
        neither. On any error nothing changes (a begun step stays begun).
        """
    def step(
        self,
        entries: Iterable[StepEntryArg] | IntArrayArg,
        T: SupportsIndex | IntArrayArg | None = None,
        tokens: IntArrayArg | None = None,
        token_offsets: IntArrayArg | None = None,
        parents: IntArrayArg | None = None,
        *,
        verify: bool | Iterable[bool] = False,
    ) -> BatchStep:
        """begin_step(...) in either form, for `with cache.step(seqs, T) as step:`; raises as
        begin_step.
        """
    def add_sequences(self, seqs: IntArrayArg) -> None:
        """add_sequence for every id of seqs (an int32/int64 array or a list of ints), all or none:
        InvalidArgumentError names an id outside [0, max_seqs) or repeated, InvalidStateError one
        already active, CapacityError more ids than free_table_rows, and nothing changes. Empty
        seqs: changes nothing but ends a begun step, as every successful verb does.
        """
    def release_sequences(self, seqs: IntArrayArg) -> None:
        """release_sequence for every id of seqs (an int32/int64 array or a list of ints), all or
        none: InvalidArgumentError names an id outside [0, max_seqs) or repeated, InvalidStateError
        one not active, and nothing changes. Empty seqs: changes nothing but ends a begun step, as
        every successful verb does.
        """
    def fork_many(self, src: SupportsIndex, dsts: IntArrayArg, upto: SupportsIndex | None = None) -> None:
        """fork(src, dst, upto) for every dst of dsts (an int32/int64 array or a list of ints): each
        inherits positions [0, upto) of src (default: all) by sharing blocks, as for parallel
        sampling. All or none: InvalidArgumentError for a bad src, upto or dst id, a dst repeated or
        equal to src; InvalidStateError for src not active or no longer holding what a query at upto
        needs, or a dst not empty; CapacityError for more inactive dsts than free_table_rows;
        nothing changes then. Empty dsts (src and upto valid): changes nothing but ends a begun
        step, as every successful verb does.
        """
    @overload
    def commit(self, step: BatchStep, accepted: None = None) -> None:
        """commit(step) commits the begun step whole (every entry's length grows by its T) and
        returns None. commit(step, accepted) commits draft trees: accepted maps a sequence to its
        accepted root path of node ids ({seq: [0, a1, ...]} or [(seq, nodes), ...]; nodes[0] = 0,
        each the child of the one before); its length grows by len(nodes), position length + d
        holding node nodes[d]. Unlisted entries must be chains and commit whole. Blocks reserved
        only for rejected nodes return to their pools. Returns one (n_copies, 2) int32 array per
        group of rows (src, dst) to copy, in order, in every layer of the group before the next step
        (none when a path is its tree's main line, at most len(nodes) - 1 otherwise), then one per
        State group (index n_groups + k: physical state slots (src, dst), the state in slot src to
        slot dst in every layer of State group k, in order), n_groups + n_state_groups arrays in
        all; afterwards the cache is as if the sequence had decoded the accepted tokens as a chain
        (a verify chain for the State groups: each accepted node's state in the slot its position's
        chain token would have written). InvalidStateError: a stale step or one of another cache.
        InvalidArgumentError (nothing changes): a tree entry committed without a path, a sequence
        not in the step or listed twice, an empty path or one longer than N, a node outside [0, N),
        nodes not a root path; accepted not as above.
        """
    @overload
    def commit(self, step: BatchStep, accepted: AcceptedArg) -> tuple[npt.NDArray[np.int32], ...]:
        ...
    def abort(self, step: BatchStep) -> None:
        """Ends the begun step without committing it (a failed forward): every length, block
        table and count is as before it began. InvalidStateError: a stale step or one of
        another cache; nothing changes."""
    def visible(self, group: SupportsIndex, seq: SupportsIndex, q: SupportsIndex, k: SupportsIndex) -> bool:
        """May the sequence's query at position q see its key at position k on the group's layers?
        InvalidArgumentError: group outside [0, n_groups), seq outside [0, max_seqs), or q or k
        negative.
        """
    def clear(self) -> None:
        """Ends every sequence and forgets every cached block."""
    # --- batch_prefix.cpp
    def lookup_prefix(self, tokens: Iterable[SupportsIndex] | IntArrayArg, namespace: int | bytes | str | None = None) -> int:
        """The prefix hit, in positions (a multiple of block_size; 0 on a miss), that adopt_prefix would
        give an empty sequence of prefix namespace `namespace` (None: 0) for `tokens` now, with no side
        effect: no block is held, no cached block's recency moves, a begun step stays begun. A
        scheduler asks it before deciding to admit. InvalidArgumentError: len(tokens) > capacity, a
        bad namespace or token id.
        """
    def enable_kv_events(self, capacity: SupportsIndex) -> None:
        """Keeps up to `capacity` undrained KV events from now on (0, the default: none), forgetting
        undrained ones and the dropped count. An event says a group stored a block key (its first
        block carrying it: the tokens are reusable there), evicted one (its last block carrying it
        was reclaimed) or that clear() forgot everything. A full queue drops new events and counts
        them (kv_events_dropped). InvalidArgumentError: capacity outside [0, 2**24]. AllocationError:
        the queue cannot be allocated (nothing changes).
        """
    def drain_kv_events(self, max: SupportsIndex | None = None) -> npt.NDArray[np.void]:
        """Removes and returns the oldest undrained KV events (all, or at most `max`) as a numpy
        structured array with fields kind (uint8: KV_EVENT_STORED, KV_EVENT_EVICTED,
        KV_EVENT_CLEARED), group (int32; -1 for cleared; n_groups + k for State group k's named
        states when BatchLimits.states_in_pool), key_lo and key_hi (uint64: the block key, as
        block_keys gives it), namespace (uint64), start and end (int32: the token positions [start,
        end) the block holds). InvalidArgumentError: max < 0.
        """
    @property
    def kv_events_pending(self) -> int:
        """KV events waiting to be drained."""
    @property
    def kv_events_capacity(self) -> int:
        """Undrained KV events kept at most (0: events are off)."""
    @property
    def kv_events_dropped(self) -> int:
        """KV events dropped because the queue was full, since enable_kv_events: when it moves, a
        consumer's view of the cache is stale.
        """

KV_EVENT_STORED: int
KV_EVENT_EVICTED: int
KV_EVENT_CLEARED: int

def block_keys(
    tokens: Iterable[SupportsIndex] | IntArrayArg, block_size: SupportsIndex, namespace: int | bytes | str | None = None
) -> npt.NDArray[np.uint64]:
    """The content keys of the full blocks of `tokens` (a 1-D int array or an ordered iterable of ints)
    in blocks of `block_size` tokens and prefix namespace `namespace` (None: 0; an int, bytes or
    str as add_sequence takes it): a uint64 array (len(tokens) // block_size, 2), columns (lo, hi),
    row i the chained key of block i, exactly the keys BatchCache names blocks by and its KV events
    carry. InvalidArgumentError: block_size < 1, a bad namespace or token id.
    """

# --- paged_pool.cpp --------------------------------------------------------------

class PagedKVPool(metaclass=_pybind11_type):
    """Reference CPU storage for a BatchCache's K/V rows and state slots: each layer holds its
    group's block pool (num_blocks * block_size rows of n_kv_heads x dim elements), grown by
    doubling as steps reach further. update() performs a step's block copies and writes its new
    rows; attention reads the live rows with mask(), or one sequence's history with gather(). A
    Shared layer stores nothing (rows and gather give its source's rows); a State layer keeps its
    State group's num_state_slots physical slots of the named tensors state_tensors gives
    (write_state, read_state, state_slots).

    dtype: float32, float16, bfloat16 (from ml_dtypes; "bfloat16" also works), int8 or uint8. Arrays
    are (n_tokens, n_kv_heads, head_dim) for K and (n_tokens, n_kv_heads, value_dim) for V,
    C-contiguous, of exactly the pool's dtype.
    """

    def __init__(
        self,
        cache: BatchCache,
        dtype: npt.DTypeLike = ...,
        *,
        initial_rows: SupportsIndex = 256,
        compute_dtype: npt.DTypeLike | None = None,
        state_tensors: _StateTensors | None = None,
    ) -> None:
        """PagedKVPool(cache, dtype=numpy.float16, *, initial_rows=256, compute_dtype=None,
        state_tensors=None): storage for `cache` in `dtype` (float32, float16, 'bfloat16' via
        ml_dtypes, int8, uint8); each layer starts with min(initial_rows, its rows) rows. dtype
        'qint8' or 'fp8_e4m3' stores quantized rows (docs/quantized.md): update takes values of
        compute_dtype (float32 by default, float16 or 'bfloat16') and rows/gather return them
        dequantized. A Shared layer stores nothing: its reads answer from its source's rows.
        state_tensors: the named tensors of each State layer's state, {name: (shape, dtype)} for
        every State layer or {layer: {name: (shape, dtype)}} per layer (numeric numpy dtypes or
        "bfloat16"; each tensor 16-byte aligned in a slot), as KVPool takes them; the pool keeps
        cache.num_state_slots(cache.state_group_of(layer)) slots of them per State layer, allocated
        (zeros) now. InvalidArgumentError: bad dtype, compute_dtype or initial_rows < 0;
        state_tensors missing for a State layer, naming a layer that is not one, an empty name, a
        dim < 1, another dtype or a slot that overflows. NotSupportedError: a cache whose states
        live in the pool's pages (BatchLimits.states_in_pool). AllocationError: the first blocks or
        the state slots cannot be allocated.
        """
    @property
    def cache(self) -> BatchCache:
        """The BatchCache it stores."""
    @property
    def dtype(self) -> np.dtype[Any] | str:
        """Storage format: the numpy dtype of every K/V element, or 'qint8' / 'fp8_e4m3' for
        quantized rows (docs/quantized.md).
        """
    @property
    def compute_dtype(self) -> np.dtype[Any]:
        """numpy dtype update takes and rows/gather return (a plain pool's dtype; float32, float16
        or bfloat16 for a quantized one).
        """
    @property
    def n_layers(self) -> int:
        """Number of layers the pool stores, as the cache's (cache.n_layers); each holds its group's
        blocks (a Shared layer none, a State layer its state slots).
        """
    @property
    def nbytes(self) -> int:
        """Bytes (K and V, every layer) of the rows in blocks some sequence holds now:
        held_blocks(group) * block_size rows per layer of the group (a Shared layer's none), plus
        every State layer's state slots (always stored).
        """
    @property
    def reserved_bytes(self) -> int:
        """Bytes of storage allocated now (K and V, every layer)."""
    def allocated_rows(self, layer: SupportsIndex) -> int:
        """Rows of the layer backed by storage now (at most num_blocks(group) * block_size).
        InvalidArgumentError: bad layer.
        """
    def reserve(self, layer: SupportsIndex, rows: SupportsIndex) -> None:
        """Grows the layer now to at least `rows` rows, so later updates below it never allocate.
        InvalidArgumentError: bad layer, rows outside [0, num_blocks * block_size]. AllocationError:
        growth failed (nothing changed).
        """
    def export_size(self, seq: SupportsIndex, n_tokens: SupportsIndex = 0) -> int:
        """Bytes export_sequence(seq) gives with `n_tokens` known token ids. InvalidArgumentError:
        bad seq, n_tokens outside [0, length]; InvalidStateError: seq not active.
        """
    def export_sequence(self, seq: SupportsIndex, tokens: _Tokens | None = None) -> bytes:
        """Sequence `seq` as a record (bytes, docs/state.md): length, removed head and holes, per
        layer the rows its group still holds (a ring's sink blocks and window, not what it released)
        and `tokens` (the ids of positions [0, len(tokens)), optional, a 1-D int32 or int64 array or
        a list of ints, copied and never cast; with all of them an importer can share a prefix it
        caches). InvalidArgumentError: bad seq, more tokens than the length, tokens of another dtype
        or shape, an id beyond 32 bits; TypeError: a list item that is not an int;
        InvalidStateError: seq not active, or a step is begun.
        """
    def export_into(self, seq: SupportsIndex, out: _WritableBuffer, tokens: _Tokens | None = None) -> int:
        """Writes export_sequence(seq)'s record into the first bytes of the buffer `out` (writable,
        C-contiguous, 8-byte aligned, at least export_size() bytes) and returns its size in bytes.
        InvalidArgumentError: out not a buffer, read-only, not C-contiguous, misaligned or too
        small, checked before anything is written; errors as export_sequence.
        """
    @overload
    def import_sequence(
        self,
        seq: SupportsIndex,
        record: _Buffer,
        *,
        written: Literal[False] = False,
        trust_tokens: bool = False,
        namespace: int | bytes | str | None = None,
    ) -> None:
        """Admits the sequence of `record` (any bytes-like object; any block size, from a BatchCache
        or a SequenceCache) as sequence `seq` (inactive): its length, removed head, holes and rows.
        A record's token ids are its sender's word: by default the sequence names no block by them
        and shares none with this cache's prefixes (an untrusted record cannot change what a later
        request reads). trust_tokens=True, or a `namespace` (as add_sequence's; trust_tokens then
        implied), names its full blocks by the record's token ids in that namespace (default: 0) and
        shares the blocks of a prefix this cache holds there (when the record knows every token id),
        not copied. Every later plan and read equals the exporter's, and so does every can_rewind
        answer the record reaches (a ring's window and sinks, a State layer's run of states ending at
        the last one). Checks everything first and changes nothing on an error (any begun step ends on success).
        InvalidArgumentError: truncated, corrupt (checksum), bad magic, a policy, shape or dtype
        other than the cache's; NotSupportedError: a newer record version, or a ring group whose
        sink blocks would keep a position the record lacks; InvalidStateError: seq is active;
        CapacityError: no free table row (batch.max_active_seqs sequences are active), length over
        capacity, too many holes, too few free blocks; InvalidArgumentError also: a bad namespace.

        written=True: returns the blocks the import wrote, an int32 (n, 3) array of rows (group,
        block index in the sequence, block id): every block of the sequence but the shared ones (a
        byte layer keeping its own copy of the rows, as TorchPagedKVPool, writes exactly these).
        None otherwise.
        """
    @overload
    def import_sequence(
        self,
        seq: SupportsIndex,
        record: _Buffer,
        *,
        written: Literal[True],
        trust_tokens: bool = False,
        namespace: int | bytes | str | None = None,
    ) -> npt.NDArray[np.int32]:
        ...
    def update(
        self, layer: SupportsIndex, step: BatchStep, k: npt.NDArray[Any], v: npt.NDArray[Any]
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """update(layer, step, k, v) -> (k_rows, v_rows): performs the layer's block copies of the
        begun step (copy-on-write), writes the step's new rows (k: (n_tokens, n_kv_heads, head_dim),
        v: (n_tokens, n_kv_heads, value_dim), C-contiguous, the pool's dtype; token t to its slot),
        and returns read-only zero-copy views of the layer's live rows, (used_blocks * block_size,
        n_kv_heads, dim): attend over them with mask(step, group). Views keep their storage alive.
        InvalidArgumentError: bad layer or array (nothing written); a Shared layer (it writes
        nothing: update its source, named in the message, then read the Shared layer with rows or
        gather); a State layer (write_state). InvalidStateError: a stale step, or a step of another
        cache. AllocationError: growth failed (nothing written).
        """
    def apply_copies(self, copies: Sequence[npt.ArrayLike]) -> None:
        """apply_copies(copies): performs a draft-tree commit's copies in every layer, copies being
        what cache.commit(step, accepted) returned: one (n, 2) int array of (src, dst) rows per
        group, then one of (src, dst) physical state slots per State group (n_groups +
        n_state_groups arrays), each performed in order in every layer of its group (a Shared
        layer's rows are its source's). Call it once per commit, before the next step's update().
        InvalidArgumentError (nothing copied): not one (n, 2) array per group and State group, a row
        outside a layer's stored rows, a slot outside [0, num_state_slots).
        """
    def apply_commit(self, copies: Sequence[npt.ArrayLike]) -> None:
        """Deprecated alias of apply_copies (removed in kvcore 0.2.0): performs a draft-tree
        commit's copies. Warns DeprecationWarning; errors as apply_copies.
        """
    def state_names(self, layer: SupportsIndex) -> list[str]:
        """The names of State layer `layer`'s state tensors, in the order state_tensors gave them.
        InvalidArgumentError: bad layer, a layer that is not a State layer.
        """
    def write_state(
        self,
        layer: SupportsIndex,
        step: BatchStep,
        states: Mapping[str, npt.NDArray[Any]],
        *,
        entry: SupportsIndex | None = None,
    ) -> None:
        """write_state(layer, step, states, *, entry=None): stores the states the begun `step` keeps
        on State layer `layer`, for every token of the step (or of entry `entry` only): states[name]
        is an array (n, *shape) of the tensor's dtype, C-contiguous, for every tensor of the layer,
        row i the state after the position of the i-th token whose write slot is set
        (plan.state_groups[k].write_slots >= 0, k = cache.state_group_of(layer)), in token order:
        every token of a verify step or a tree, the last of each other entry. Each goes to its
        physical slot. Every name, shape and dtype is checked before anything is written.
        InvalidArgumentError: bad layer, not a State layer, a bad entry, a missing or unknown name,
        another shape or dtype, not C-contiguous; InvalidStateError: a stale step or another
        cache's.
        """
    def read_state(self, layer: SupportsIndex, step: BatchStep, token: SupportsIndex) -> dict[str, npt.NDArray[Any]]:
        """read_state(layer, step, token) -> dict: the state token `token` of the begun `step`
        starts from on State layer `layer`, as name -> read-only array of the tensor's shape (a
        copy): the slot plan.state_groups[k].read_slots[token] names (the state after position - 1:
        an entry's first token's, a tree node's parent's, a verify step's previous token's), zeros
        at position 0. Read an entry's first token before write_state (an entry may write the slot
        it reads). InvalidArgumentError: bad layer, not a State layer, token outside [0, n_tokens),
        a token past position 0 that reads no slot (its state is carried within the forward: a step
        without verify keeps only its last); InvalidStateError: a stale step or another cache's.
        """
    def state_slots(self, layer: SupportsIndex, name: str) -> npt.NDArray[Any]:
        """Read-only zero-copy array (num_slots, *shape) of tensor `name` in every physical slot of
        State layer `layer` (num_slots = cache.num_state_slots(cache.state_group_of(layer))), for
        kernels that index slots themselves (vLLM / SGLang state_indices:
        plan.state_groups[k].read_slots and write_slots per token). The view keeps the storage
        alive. InvalidArgumentError: bad layer, not a State layer, no such tensor.
        """
    def rows_quantized(self, layer: SupportsIndex) -> dict[str, npt.NDArray[Any] | None]:
        """The raw quantized live rows, zero-copy and read-only: a dict of k, v (int8 values for
        'qint8'; uint8 bytes of float8 e4m3fn for 'fp8_e4m3'), k_scales, v_scales (float32, (rows,
        n_kv_heads)), k_zero_points, v_zero_points (int8; None for fp8). InvalidArgumentError: bad
        layer, a pool that is not quantized. InvalidStateError: the live rows are not all stored
        yet.
        """
    def rows(self, layer: SupportsIndex) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """rows(layer) -> (k_rows, v_rows): the views update() returns, without writing (a quantized
        pool's: the live rows dequantized into a workspace the next read reuses); a Shared layer's
        are its source's rows. InvalidArgumentError: bad layer, a State layer (state_slots).
        InvalidStateError: the live rows are not all stored yet (update the layer for the begun step
        first).
        """
    def mask(self, step: BatchStep, group: SupportsIndex) -> npt.NDArray[np.bool_]:
        """mask(step, group) -> bool (n_tokens, used_blocks * block_size): mask[t, r] is True when
        the step's token t may see the key in row r of the group's layers (its own sequence's, by
        the visibility rule, not removed): the columns of update()'s rows. Read-only, built once per
        group and step and shared by the group's layers (step.plan().mask(group) gives a new one).
        InvalidArgumentError: bad group. InvalidStateError: a stale step or another cache's.
        """
    def gather(
        self, layer: SupportsIndex, step: BatchStep, entry: SupportsIndex
    ) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[np.int64]]:
        """gather(layer, step, entry) -> (k, v, positions): the history entry `entry` of the step
        sees on this layer (every position below its context length that one of its queries sees:
        the sinks and the first query's window on a ring, all kept positions when flat; removed ones
        skipped), in increasing positions, as new contiguous arrays (n, n_kv_heads, dim) and int64
        (n,); a Shared layer's are its source's. Call it after update(). InvalidArgumentError: bad
        layer or entry, a State layer (read_state). InvalidStateError: a stale step, or the layer
        not updated for it yet.
        """
    @staticmethod
    def required_bytes(cache: BatchCache, dtype: npt.DTypeLike, *, state_tensors: _StateTensors | None = None) -> int:
        """Bytes a pool of `cache`'s layers in `dtype` holds at most (every block of every layer and
        every State layer's slots of its state_tensors, as the C++ arena mode takes them, alignment
        slack included). InvalidArgumentError: bad dtype, bad state_tensors (as PagedKVPool).
        """

def _copy_rows(
    k_dst: Sequence[int],
    v_dst: Sequence[int],
    esize: int,
    writes: Sequence[int],
    k_src: int,
    k_strides: Sequence[int],
    v_src: int,
    v_strides: Sequence[int],
) -> None:
    """Internal (kvcore.torch.pool): copies rows of two source tensors into two pool tensors.

    ``k_dst``/``v_dst``: (address, B, H, D, stride b, stride h, stride row, stride d) of a pool
    tensor [B, H, rows, D]; ``esize``: bytes per element; ``writes``: flat (row, n, offset) triples,
    source rows [offset, offset + n) to pool rows [row, row + n); ``k_src``/``v_src``: addresses of
    the [B, H, T, D] sources, ``k_strides``/``v_strides`` their element strides. Nothing is checked:
    the caller guarantees same dtype, CPU memory, and rows within both tensors (wrong values corrupt
    memory).
    """
