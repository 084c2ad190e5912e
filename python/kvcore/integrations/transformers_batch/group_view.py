"""One transformers attention type as transformers' input builder sees it: a kvcore group.

transformers' continuous-batching input code walks ``cache.cache_allocators``
(one allocator per attention type) for the type's index into the index
tensors, its key length per request and its trash rows. ``GroupView`` answers
those for a kvcore group, so the input code runs unchanged.
"""

from __future__ import annotations

from kvcore.integrations.transformers_config import CHUNKED, SLIDING


class GroupView:
    """The face of kvcore group ``group`` that transformers' input builder reads.

    ``index``: the attention type's place in ``cache_allocators`` (its row of the index
    tensors). ``layer_type``: ``"full_attention"``, ``"sliding_attention"`` or
    ``"chunked_attention"``. ``window``: the sliding window (keys a query sees, counting
    itself), or the chunk size of a chunked type (a query at ``p`` sees ``K * (p // K) .. p``);
    0 for full attention. A chunked type relies on no forward carrying a request across a chunk
    boundary (``capped_scheduler``), so transformers' causal mask over the chunk's keys is exact.
    """

    # Rows that padded tokens read and write. Padding is off (no CUDA graphs, no compile), so
    # no index names them; row 0 is a valid row of every pool.
    read_trash_index = 0
    write_trash_index = 0

    def __init__(self, index: int, layer_type: str, group: int, layers: list[int], window: int) -> None:
        self.index = index
        self.layer_type = layer_type
        self.group = group
        self.layer_indices = layers
        self.window = window if layer_type == SLIDING else 0
        self.chunk = window if layer_type == CHUNKED else 0

    def get_seqlen_k(self, past_length: int, query_length: int) -> int:
        """Keys a request's queries read in this group: its whole history, the window's
        ``W - 1`` positions before the step and the step's own, or its chunk's positions so far
        and the step's own, as transformers' masks expect."""
        return past_length - self.first_read(past_length) + query_length

    def first_read(self, past_length: int) -> int:
        """The oldest position a request at ``past_length`` reads in this group."""
        if self.window:
            return max(0, past_length - self.window + 1)
        if self.chunk:
            return past_length - past_length % self.chunk
        return 0


__all__ = ["GroupView"]
