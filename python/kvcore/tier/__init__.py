"""The host tier: a bounded host-memory store beneath a ``BatchCache`` (issue 42; docs/tier.md).

A device pool's least-recently-used eviction throws away prefixes later prompts could reuse.
``HostTier`` keeps them in host memory. A sequence about to be released (or any active one) is
spilled: exported as a record (docs/state.md) with its token ids. A **flat model's** record (every
layer Flat, or Shared with a Flat source) is cut into its full blocks, each held once whoever
spilled it and keyed by ``(namespace, block size, block key)``, the key ``kvcore.block_keys`` and
the KV events give; another model's (a ring, chunked or State layer, whose record serves only
its own length) is held whole, keyed by its last full block's key. Before a prompt is admitted,
``restore`` finds the longest prefix of it the tier holds in the prompt's namespace and, when it
is longer than the device's ``lookup_prefix`` hit, imports it into a free sequence id trusted in
that namespace (a flat model's as the record of exactly the held blocks of the hit, assembled
from them) and releases it: the blocks wait cached on the device and the caller's
``adopt_prefix`` hits them. Every restore is an import, so it is exact: every plan and read
after it equals the exporter's.

Eviction is by bytes, a segmented LRU: what was stored and not used since goes first, least
recently used first, then what was used again (a restore, or a spill of a held prefix); never a
block before a held block that extends it, so what the tier holds of a prefix is always its
first blocks. Records that enter by ``put``
are bytes from elsewhere: checked completely as an import checks them before any of it is
stored, and the assembled or held record is checked again by the import at restore. One thread
at a time (as the cache).

One concept per module: ``kvcore.tier.host`` (``HostTier``), ``kvcore.tier.blocks``
(``BlockLayout``: a flat record cut into blocks and blocks put back into a record),
``kvcore.tier.segments`` (``Segments``: the eviction order),
``kvcore.tier.facts`` (``RecordFacts``, ``Restored``, the checks a record must pass to key a
prefix) and ``kvcore.tier.keys`` (``namespace_id``, ``token_ids``: what both tiers check of a
namespace and a prompt).
"""

from __future__ import annotations

from kvcore.tier.facts import RecordFacts, Restored
from kvcore.tier.host import HostTier
from kvcore.tier.keys import Namespace, Tokens, namespace_id, token_ids

__all__ = ["HostTier", "Namespace", "RecordFacts", "Restored", "Tokens", "namespace_id", "token_ids"]
