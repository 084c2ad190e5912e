"""What a tier knows of a record and what a restore did: ``RecordFacts`` (a validated record's
namespace, block size, block keys, length and kinds, and ``serves``, the one rule of which hits
it gives, shared by the host tier and kvcore.cluster's store), ``Restored`` (one
``HostTier.restore``'s result) and ``prefix_facts`` (the checks a record must pass to key a
prefix at all)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcore._errors import InvalidStateError
from kvcore.state import RecordInfo


@dataclass(frozen=True)
class Restored:
    """What one ``HostTier.restore`` did. Positions are tokens; ``bytes`` are the record's bytes
    read by the import (host to device), 0 when nothing was imported."""

    #: The device's prefix hit for the prompt before the restore (positions).
    device_hit: int
    #: The device's prefix hit after it: what ``adopt_prefix`` now gives (positions).
    hit: int
    #: The record's bytes moved into the device pool (0: nothing restored). A flat model's
    #: record is assembled from the held blocks of the hit: exactly the hit's positions.
    bytes: int
    #: Wall time of the assembly, import and release (seconds; 0.0 when nothing was imported).
    seconds: float

    @property
    def tokens(self) -> int:
        """Positions of the prompt the restore added to the device's hit (``hit - device_hit``)."""
        return self.hit - self.device_hit


class RecordFacts:
    """What a tier knows of one validated record (kvcore.tier's host tier and kvcore.cluster's
    store): its prefix namespace id, its block size in tokens, the chained keys of its full
    blocks (``kvcore.block_keys``), its length in tokens, ``flat`` (every layer flat, or shared
    with a flat one: any full-block prefix serves) and ``state`` (a State layer: its state is
    carried at the record's length only). ``serves`` is the rule both tiers apply to a hit."""

    __slots__ = ("namespace", "block_size", "keys", "length", "flat", "state")

    def __init__(self, namespace: int, block_size: int, keys: list[tuple[int, int]], length: int, flat: bool,
                 state: bool) -> None:
        self.namespace = namespace
        self.block_size = block_size
        self.keys = keys
        self.length = length
        self.flat = flat
        self.state = state

    def serves(self, n_blocks: int, keep: bool) -> bool:
        """Can the record give a hit of `n_blocks` full blocks? A flat model's at every boundary
        (keep=True rewinds to it). Otherwise released (keep=False) only at its last full block (a
        ring's window and a State layer's state are carried at the record's length only: the
        import names the state after a State model's last block as a snapshot, docs/state.md);
        kept (keep=True) only at its length."""
        if not 1 <= n_blocks <= len(self.keys):
            return False
        if self.flat:
            return True
        if keep:
            return n_blocks * self.block_size == self.length
        return n_blocks == len(self.keys)


def prefix_facts(info: RecordInfo, block: int, what: str) -> tuple[int, bool, bool]:
    """(full blocks, flat, state) of a validated record that keys a prefix in blocks of `block`.
    InvalidStateError (naming `what`): positions removed, token ids missing, shorter than one
    block, a State layer at a length that is not a multiple of `block`."""
    if info.start != 0 or info.holes:
        raise InvalidStateError(f"{what}: the record removed positions (start {info.start}, "
                                f"{len(info.holes)} holes): it keys no prefix")
    if len(info.tokens) != info.length:
        raise InvalidStateError(f"{what}: the record carries {len(info.tokens)} token ids for length "
                                f"{info.length}: it keys no prefix without every one")
    n_full = info.length // block
    if n_full == 0:
        raise InvalidStateError(f"{what}: the record's length {info.length} < block_size {block}: no full block to key")
    kinds = [layer.kind for layer in info.layers]
    if "state" in kinds and info.length % block:
        raise InvalidStateError(
            f"{what}: length {info.length} is not a multiple of block_size {block} and the model has State layers: "
            "a state is named only at a block boundary, so the record would serve no prefix"
        )
    flat = all(k == "flat" or (k == "shared" and kinds[layer.param] == "flat") for k, layer in zip(kinds, info.layers))
    return n_full, flat, "state" in kinds
