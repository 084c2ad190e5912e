"""kvcore: a backend-neutral KV-cache core for LLM runtimes.

kvcore plans each step with integers: where a step's new K/V rows go and which
rows every query reads, for full-history (Flat), sliding-window (Ring, with
optional attention sinks), chunked (Chunked), shared-K/V (Shared) and
recurrent-state (State) layers under one logical length.
"""

from __future__ import annotations

from kvcore._core import (
    KV_EVENT_CLEARED,
    KV_EVENT_EVICTED,
    KV_EVENT_STORED,
    BatchCache,
    BatchLimits,
    BatchStep,
    BatchStepPlan,
    CacheBase,
    CacheConfig,
    Chunked,
    Flat,
    GroupPlan,
    KVPool,
    LayerConfig,
    LayerGeometry,
    LayerPolicy,
    PagedKVPool,
    Ring,
    Run,
    SequenceInfo,
    SeqStepPlan,
    SequenceCache,
    Shared,
    State,
    StateGroupPlan,
    Step,
    __version__,
    block_keys,
)
from kvcore._errors import (
    AllocationError,
    AlreadyRegisteredError,
    CapacityError,
    Error,
    InternalError,
    InvalidArgumentError,
    InvalidStateError,
    KVCacheError,
    NotFoundError,
    NotSupportedError,
)
from kvcore._paths import get_cmake_dir, get_include
from kvcore.hf_config import config_from_hf
from kvcore import registry
from kvcore.registry import Session, build, register_builder, unregister_builder

__all__ = [
    "AllocationError",
    "AlreadyRegisteredError",
    "BatchCache",
    "BatchLimits",
    "BatchStep",
    "BatchStepPlan",
    "CacheBase",
    "CacheConfig",
    "CapacityError",
    "Chunked",
    "Error",
    "Flat",
    "GroupPlan",
    "InternalError",
    "InvalidArgumentError",
    "InvalidStateError",
    "KVCacheError",
    "KV_EVENT_CLEARED",
    "KV_EVENT_EVICTED",
    "KV_EVENT_STORED",
    "KVPool",
    "LayerConfig",
    "LayerGeometry",
    "LayerPolicy",
    "NotFoundError",
    "NotSupportedError",
    "PagedKVPool",
    "Ring",
    "Run",
    "SeqStepPlan",
    "SequenceCache",
    "SequenceInfo",
    "Session",
    "Shared",
    "State",
    "StateGroupPlan",
    "Step",
    "__version__",
    "block_keys",
    "build",
    "config_from_hf",
    "get_cmake_dir",
    "get_include",
    "register_builder",
    "registry",
    "unregister_builder",
]
