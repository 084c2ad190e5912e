"""The knobs both demos share: the model they run and the K/V dtype of its pools."""

from __future__ import annotations

import dataclasses
import numpy as np
import numpy.typing as npt

from kvcore_demo.model import ModelConfig

#: Largest |logit difference| accepted against the oracle, per K/V dtype. float32
#: is exact up to summation order; a 16-bit pool can round one K/V element to the
#: neighbouring value when the two paths' matmuls differ in the last float32 bit.
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}
#: Bytes of one K or V element, per dtype of TOLERANCE.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """The small model a demo runs (kvcore_demo.model) and its cache's layer mix:
    every `flat_every`-th layer flat, the others a ring of `window` positions
    with `sinks` sinks; `max_step` tokens per sequence and step; pools of
    `dtype`."""

    layers: int = 12
    flat_every: int = 6
    window: int = 32
    sinks: int = 4
    max_step: int = 16
    seed: int = 0
    dtype: str = "float32"
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 32
    d_ff: int = 384
    vocab_size: int = 512

    def check_dtype(self) -> None:
        """Raises ValueError unless the model can compute in `dtype`."""
        if self.dtype not in TOLERANCE:
            raise ValueError(
                f"--dtype = {self.dtype}: must be one of {', '.join(TOLERANCE)} "
                "(int8/uint8 pools move bytes, but this model computes in floats)"
            )

    def check_step(self, capacity: int, draft: int, capacity_rule: str) -> None:
        """Raises ValueError when `max_step` exceeds `capacity` (the run's longest
        sequence, positions; `capacity_rule` says how the options make it) or when
        `draft` tokens and the token before them do not fit in one step: a demo
        refuses such values rather than running with smaller ones."""
        if self.max_step > capacity:
            raise ValueError(f"--max-step = {self.max_step}: must be <= {capacity}, the longest sequence "
                             f"of this run ({capacity_rule})")
        if draft > self.max_step - 1:
            raise ValueError(f"--draft = {draft}: must be <= --max-step - 1 = {self.max_step - 1} "
                             "(a speculative step carries the last token and its drafts)")

    def check_tree(self, tree: int) -> None:
        """Raises ValueError unless `tree` (draft tree nodes per step, the root included)
        is 0 (no trees) or in [2, max_step]: a tree is verified in one step."""
        if tree != 0 and not 2 <= tree <= self.max_step:
            raise ValueError(f"--tree = {tree}: must be 0 (no trees) or in [2, --max-step = {self.max_step}]")

    def model_config(self) -> ModelConfig:
        """The ModelConfig these options describe."""
        return ModelConfig(
            vocab_size=self.vocab_size,
            d_model=self.d_model,
            n_layers=self.layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            d_ff=self.d_ff,
            window=self.window,
            sinks=self.sinks,
            flat_every=self.flat_every,
            seed=self.seed,
        )


def kv_dtype(name: str) -> npt.DTypeLike:
    """The numpy dtype of a pool named `name` (a key of TOLERANCE). Raises ValueError
    for bfloat16 when the ml_dtypes package is missing."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ValueError('--dtype bfloat16 needs the ml_dtypes package: pip install "kvcore[bfloat16]"') from e
        return ml_dtypes.bfloat16  # type: ignore[no-any-return]
    return np.dtype(name)


def kv_bytes_all_flat(layers: int, length: int, n_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Bytes of K and V of `length` positions in every one of `layers` layers kept whole
    (no sliding window), `itemsize` bytes an element: what an all-flat cache holds."""
    return 2 * layers * length * n_kv_heads * head_dim * itemsize


def model_summary(cfg: ModelConfig) -> dict[str, int]:
    """The report's "model" entry: layer counts (ring and flat), window and sinks
    (positions), widths, vocabulary size and seed of the model `cfg` describes."""
    n_flat = sum(cfg.is_flat(i) for i in range(cfg.n_layers))
    return {
        "layers": cfg.n_layers,
        "ring_layers": cfg.n_layers - n_flat,
        "flat_layers": n_flat,
        "window": cfg.window,
        "sinks": cfg.sinks,
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "seed": cfg.seed,
    }

