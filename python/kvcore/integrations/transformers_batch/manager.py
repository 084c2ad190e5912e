"""``KVCoreBatchingManager``: transformers' ``ContinuousBatchingManager`` with its cache served by kvcore.

Everything a user touches is transformers' own (``add_request``,
``add_requests``, ``get_result``, ``request_id_iter``, ``cancel_request``,
``start``/``stop``, the background loop, scheduler, sampling and outputs); the
manager only builds its batch processor around a ``KVCorePagedCache`` and a
``Preemption`` in place of ``PagedAttentionCache`` and ``OffloadingManager``.
Options are checked, and the model's layers mapped onto kvcore, before anything
runs; ``counters`` tells what kvcore did.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass
from typing import Any, Optional, Union

from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import continuous_api as cb_api
from transformers.generation.continuous_batching.initialization import update_cb_config_after_cache_creation
from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING, FIFOScheduler

from kvcore._core import CacheConfig
from kvcore._errors import InvalidArgumentError, NotSupportedError
from kvcore.integrations.transformers_batch.chunked_inputs import chunked_types_pass_setup, make_room_for_chunked
from kvcore.integrations.transformers_batch.chunking import capped_scheduler
from kvcore.integrations.transformers_batch.counters import BatchCounters
from kvcore.integrations.transformers_batch.options import BatchOptions, batch_config, check_fits, resolved_capacity
from kvcore.integrations.transformers_batch.paged_cache import KVCorePagedCache
from kvcore.integrations.transformers_batch.preemption import Preemption
from kvcore.integrations.transformers_config import CHUNKED
from kvcore.integrations.transformers_versions import check_batching_support

_ATTENTION = ("sdpa", "eager", "paged|eager", "paged|sdpa")


def kvcore_cb_config(options: BatchOptions, given: Optional[ContinuousBatchingConfig]) -> ContinuousBatchingConfig:
    """transformers' continuous-batching config for kvcore: a copy of the caller's (or a default;
    the caller's is not changed, as transformers' own leaves it), with the token budget from
    ``options``, at most ``max_seqs`` requests per forward, and the paths kvcore does not serve
    turned off (decode fast path, CUDA graphs, async batching, flash, CPU swap). Raises
    NotSupportedError for a compile config, CUDA graphs or async batching."""
    cb = deepcopy(given) if given is not None else ContinuousBatchingConfig()
    for name in ("varlen_compile_config", "decode_compile_config"):
        if getattr(cb, name, None) is not None:
            raise NotSupportedError(f"continuous_batching_config.{name}: kvcore's continuous batching does not compile")
    if cb.use_cuda_graph not in (None, False, (False, False)):
        raise NotSupportedError("continuous_batching_config.use_cuda_graph: kvcore's continuous batching runs eagerly")
    if cb.use_async_batching:
        raise NotSupportedError(
            "continuous_batching_config.use_async_batching: kvcore plans each forward after the last"
        )
    cb.max_batch_tokens = options.max_batch_tokens
    cb.max_requests_per_batch = min(cb.max_requests_per_batch or options.max_seqs, options.max_seqs)
    cb.max_blocks_per_request = 0
    cb.use_cuda_graph = False
    cb.use_async_batching = False
    cb.auto_switch_to_flash = False
    cb.cpu_offload_space = 0.0
    cb.allow_block_sharing = True
    return cb


def check_model(model: Any, options: BatchOptions) -> tuple[CacheConfig, dict[str, list[int]]]:
    """Refuse, before anything runs, a model kvcore's continuous batching cannot serve; returns the
    kvcore config serving it and transformers' layers per attention type (``batch_config``)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "generate_batch"):
        raise NotSupportedError(f"{type(model).__name__}: not a transformers generation model")
    attn = config._attn_implementation
    if attn not in _ATTENTION:
        raise NotSupportedError(
            f"attn_implementation = {attn!r}: kvcore's continuous batching attends through transformers' "
            f"{' / '.join(_ATTENTION)} paged paths (masks from its read indices)"
        )
    return batch_config(config.get_text_config(), options)


@dataclass(frozen=True)
class Setup:
    """What ``checked_setup`` found: the options, the generation config, the longest request, and
    the kvcore config with transformers' layers per attention type (built once, used by the cache)."""

    options: BatchOptions
    generation_config: GenerationConfig
    capacity: int
    cache_config: CacheConfig
    groups: dict[str, list[int]]


def checked_setup(model: Any, generation_config: Optional[GenerationConfig], options: dict[str, Any]) -> Setup:
    """Everything a manager checks before it changes anything (the model's attention, the
    generation config): the release, the option names and values, the model, the generation
    config and its samples."""
    check_batching_support()
    unknown = sorted(set(options) - set(BatchOptions.names()))
    if unknown:
        raise InvalidArgumentError(f"unknown option {unknown[0]!r}: expected one of {', '.join(BatchOptions.names())}")
    checked = BatchOptions(**options)
    cache_config, groups = check_model(model, checked)
    gen = generation_config if generation_config is not None else model.generation_config
    if gen is None:
        raise InvalidArgumentError("generation_config: none given and the model has none")
    samples = gen.num_return_sequences or 1
    if samples > checked.max_seqs:
        raise InvalidArgumentError(f"num_return_sequences = {samples}: must be <= max_seqs = {checked.max_seqs}")
    capacity = resolved_capacity(checked, model.config.get_text_config())
    return Setup(checked, gen, capacity, cache_config, groups)


class KVCoreBatchingManager(cb_api.ContinuousBatchingManager):  # type: ignore[misc]  # transformers is untyped
    """transformers' continuous-batching manager whose cache is kvcore's.

    ``model``: a transformers causal LM (sdpa or eager attention). ``generation_config``: as for
    ``model.init_continuous_batching`` (default: the model's). ``continuous_batching_config``:
    transformers' (its token budget and paths are set from ``options``, see ``kvcore_cb_config``).
    ``options``: ``BatchOptions`` fields (``block_size``, ``max_seqs``, ``max_batch_tokens``,
    ``max_step``, ``capacity``, ``num_blocks``, ``max_tokens_read``, ``wait_for_shared_prefill``,
    ``kv_dtype``: "int8" / "fp8" store K/V quantized). Raises NotSupportedError for an
    unsupported transformers release or model, InvalidArgumentError for a bad option, before
    anything runs. Usable as a context manager (``start`` on entry, ``stop`` on exit).
    ``setup``: what ``checked_setup`` returned for these arguments (``generate_batch`` checks
    first), in place of ``options``.
    """

    def __init__(
        self,
        model: Any,
        generation_config: Optional[GenerationConfig] = None,
        continuous_batching_config: Optional[ContinuousBatchingConfig] = None,
        workload_hints: Any = None,
        *,
        setup: Optional[Setup] = None,
        **options: Any,
    ) -> None:
        if setup is None:
            setup = checked_setup(model, generation_config, options)
        elif options:
            raise InvalidArgumentError(f"option {sorted(options)[0]!r}: given with setup, which holds the options")
        self.setup = setup
        self.options, self.capacity = setup.options, setup.capacity
        gen = setup.generation_config
        cb = kvcore_cb_config(self.options, continuous_batching_config)
        if gen.eos_token_id is None:  # transformers' own default for continuous batching, on our copy
            gen = deepcopy(gen)
            gen.eos_token_id = -1
        self.counters = BatchCounters()
        self.cache: Optional[KVCorePagedCache] = None
        with chunked_types_pass_setup():
            super().__init__(model, gen, cb, workload_hints)

    def _check_fits(self, input_ids: list[int], max_new_tokens: Optional[int], what: str) -> None:
        """``check_fits`` with ``max_new_tokens``, else the generation config's."""
        new = self.generation_config.max_new_tokens if max_new_tokens is None else max_new_tokens
        check_fits(input_ids, new, self.capacity, what)

    def add_request(self, input_ids: list[int], request_id: Optional[str] = None, max_new_tokens: Optional[int] = None,
                    streaming: bool = False, record_timestamps: bool = False,
                    eos_token_id: Union[int, list[int], None] = None, **logit_processor_kwargs: Any) -> Optional[str]:  # fmt: skip
        """transformers' ``add_request``, after checking the request fits kvcore's ``capacity``
        (prompt plus ``max_new_tokens``): InvalidArgumentError, nothing queued, otherwise."""
        self._check_fits(input_ids, max_new_tokens, f"request {request_id or '(next)'}")
        added: Optional[str] = super().add_request(
            input_ids, request_id=request_id, max_new_tokens=max_new_tokens, streaming=streaming,
            record_timestamps=record_timestamps, eos_token_id=eos_token_id, **logit_processor_kwargs,
        )  # fmt: skip
        return added

    def add_requests(self, inputs: list[list[int]], max_new_tokens: Optional[int] = None, streaming: bool = False,
                     record_timestamps: bool = False, **logit_processor_kwargs: Any) -> list[str]:  # fmt: skip
        """transformers' ``add_requests``, after checking every request fits kvcore's ``capacity``:
        InvalidArgumentError naming the first that does not, nothing queued (no request id taken)."""
        for i, input_ids in enumerate(inputs):
            self._check_fits(input_ids, max_new_tokens, f"inputs[{i}]")
        ids: list[str] = super().add_requests(
            inputs, max_new_tokens=max_new_tokens, streaming=streaming, record_timestamps=record_timestamps,
            **logit_processor_kwargs,
        )  # fmt: skip
        return ids

    def start(self) -> None:
        """Start the background generation thread (counters are zeroed)."""
        self.counters.reset()
        super().start()

    def __enter__(self) -> "KVCoreBatchingManager":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(block=True)

    def _create_batch_processor(self) -> cb_api.ContinuousBatchProcessor:
        """transformers' batch processor around kvcore's cache and preemption (reused when it exists)."""
        existing = getattr(self, "batch_processor", None)
        if isinstance(existing, cb_api.ContinuousBatchProcessor):
            existing.reset()
            make_room_for_chunked(existing.inputs_and_outputs, existing.cache.cache_allocators)
            return existing
        cb = self.continuous_batching_config
        cache = KVCorePagedCache(
            self.model.config.get_text_config(), self.options, self.model.device, self.model.dtype,
            planned_config=(self.setup.cache_config, self.setup.groups),
        )  # fmt: skip
        cache.counters = self.counters
        self.cache = cache
        self._use_prefix_sharing = True
        update_cb_config_after_cache_creation(cb, num_blocks=cache.num_blocks, max_batch_tokens=cache.max_batch_tokens)
        cb.max_blocks_per_request = 0
        base = SCHEDULER_MAPPING.get(cb.scheduler_type, FIFOScheduler)
        chunked = cache.cache_allocators.get(CHUNKED)
        scheduler_cls = capped_scheduler(base, cache.batch.max_step, chunked.chunk if chunked else 0)
        scheduler = scheduler_cls(
            cache=cache, safety_margin=cb.safety_margin, max_requests_per_batch=cb.max_requests_per_batch
        )
        processor = cb_api.ContinuousBatchProcessor(
            cache=cache,  # type: ignore[arg-type, unused-ignore]  # duck-typed: answers every PagedAttentionCache call
            config=self.model.config.get_text_config(),
            generation_config=self.generation_config,
            continuous_batching_config=cb,
            logit_processor=self.logit_processor,
            input_queue=self.input_queue if self.is_tp_driver else None,
            cancel_queue=self.cancel_queue if self.is_tp_driver else None,
            output_router=self.output_router,
            background_thread_status=self.background_thread_status,
            model_device=self.model.device,
            model_dtype=self.model.dtype,
            scheduler=scheduler,
            distributed_helper=self.distributed_helper,
        )
        if processor.model_runner.pad_inputs or processor.use_async_batching:
            raise NotSupportedError("kvcore's continuous batching needs unpadded, synchronous forwards")
        make_room_for_chunked(processor.inputs_and_outputs, cache.cache_allocators)
        processor.offloading_manager = Preemption(cache, scheduler)  # type: ignore[assignment, unused-ignore]  # duck-typed
        return processor


def init_kvcore_batching(
    model: Any, generation_config: Optional[GenerationConfig] = None, **options: Any
) -> KVCoreBatchingManager:
    """``model.init_continuous_batching`` served by kvcore: a ``KVCoreBatchingManager`` (not started)."""
    cb = options.pop("continuous_batching_config", None)
    return KVCoreBatchingManager(model, generation_config, cb, **options)


def generate_batch(
    model: Any,
    inputs: list[list[int]],
    generation_config: Optional[GenerationConfig] = None,
    *,
    counters: Optional[BatchCounters] = None,
    **options: Any,
) -> dict[str, Any]:
    """``model.generate_batch(inputs, generation_config, ...)`` with kvcore serving the cache;
    returns exactly what it returns (request id -> ``GenerationOutput``, inputs' order).

    ``options``: ``BatchOptions`` fields (``kv_dtype="int8"`` / ``"fp8"``: K/V stored quantized,
    ``TorchQuantizedPagedKVPool``), plus ``model.generate_batch``'s own keywords
    (``continuous_batching_config``, ``max_new_tokens``, ``record_timestamps``, ``progress_bar``).
    ``counters``: a ``BatchCounters`` filled with the run's counters. Errors as
    ``KVCoreBatchingManager``, raised before anything runs.
    """
    kv_options = {k: options.pop(k) for k in list(options) if k in BatchOptions.names()}
    cb = options.pop("continuous_batching_config", None)
    unknown = sorted(set(options) - {"max_new_tokens", "record_timestamps", "progress_bar"})
    if unknown:
        raise InvalidArgumentError(
            f"unknown option {unknown[0]!r}: expected {', '.join(BatchOptions.names())}, continuous_batching_config, "
            f"max_new_tokens, record_timestamps or progress_bar"
        )
    setup = checked_setup(model, generation_config, kv_options)
    gen = setup.generation_config
    new = options.get("max_new_tokens")
    new = gen.max_new_tokens if new is None else new  # as model.generate_batch reads it
    # Checked before the manager switches the model's attention (a request's own refusal
    # would reach transformers' generation loop, which logs it and returns without it).
    for i, x in enumerate(inputs):
        check_fits(x, new, setup.capacity, f"inputs[{i}]")
    hints = cb_api.WorkloadHints(
        max_prompt_length=max((len(x) for x in inputs), default=0),
        max_generated_length=new or 0,
        num_requests=len(inputs) * (gen.num_return_sequences or 1),
    )
    manager = KVCoreBatchingManager(model, generation_config, cb, hints, setup=setup)
    previous = getattr(model, "_cached_continuous_batching_manager", None)
    model._cached_continuous_batching_manager = manager  # generate_batch runs the cached manager
    try:
        result: dict[str, Any] = model.generate_batch(
            inputs, generation_config=generation_config, warmup=False, **options
        )
    finally:
        if previous is None:
            if getattr(model, "_cached_continuous_batching_manager", None) is manager:
                del model._cached_continuous_batching_manager
        else:
            model._cached_continuous_batching_manager = previous
    if counters is not None:
        for name, value in manager.counters.as_dict().items():
            setattr(counters, name, value)
    return result


__all__ = [
    "KVCoreBatchingManager",
    "Setup",
    "check_model",
    "checked_setup",
    "generate_batch",
    "init_kvcore_batching",
    "kvcore_cb_config",
]
