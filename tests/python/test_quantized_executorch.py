"""kvcore's qint8 rows equal ExecuTorch's QuantizedKVCache bit for bit (docs/quantized.md).

Runs ExecuTorch's own code: ``QuantizedKVCache._quantize`` (the
``quantized_decomposed`` ops ``choose_qparams_per_token_asymmetric`` and
``quantize_per_token``; scales stored as float32, zero points as int8, as its
``_quantize_and_update`` stores them) and ``dequantize_per_token`` as its
``_update_and_return_float_values`` calls it (float64 scales, int64 zero points,
float32 out). Without executorch (scripts/test.sh installs it) the tests that need
its quantizer skip, visibly, and the skip budget fails the run (needs.py); an
executorch that is there but does not import fails them with the cause. fp8 is
checked against torch's float8_e4m3fn cast of the same rule.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import numpy.typing as npt
import pytest
from needs import need

import kvcore

torch = need("torch")
need("torch.ao.quantization.fx._decomposed", reason="registers torch's quantized_decomposed ops")

Array = npt.NDArray[Any]
QD = torch.ops.quantized_decomposed


def executorch_quantize() -> Callable[[Any], tuple[Any, Any, Any]]:
    """ExecuTorch's QuantizedKVCache._quantize, giving the dtypes it stores (float32 scales,
    int8 zero points). Skips the calling test when executorch is not installed."""
    custom_kv_cache = need(
        "executorch.examples.models.llama.source_transformation.custom_kv_cache",
        reason="the reference is ExecuTorch's QuantizedKVCache (executorch==1.5.1, installed --no-deps by scripts/test.sh)",
    )
    cache = custom_kv_cache.QuantizedKVCache(1, 1, 1, 1, custom_kv_cache.QuantizedCacheType.AffineAsymmetric)

    def quantize(x: Any) -> tuple[Any, Any, Any]:
        q, s, z = cache._quantize(x)
        return q, s.to(torch.float32), z.to(torch.int8)

    return quantize


def executorch_dequantize(q: Any, s: Any, z: Any) -> Any:
    return QD.dequantize_per_token(q, s.to(torch.float64), z.to(torch.int64), -128, 127, torch.int8, torch.float32)


def adversarial(rng: np.random.Generator, heads: int, dim: int) -> Array:
    """Rows (n, heads, dim): random scales, zeros, constants, denormals, one-signed rows, huge
    values, exact ties of the quantization grid."""
    rows = [rng.normal(size=(heads, dim)) * 10.0 ** rng.uniform(-6, 6, size=(heads, 1)) for _ in range(200)]
    rows += [np.zeros((heads, dim)), np.full((heads, dim), 3.5), np.full((heads, dim), -7.25)]
    rows += [rng.uniform(1e-45, 1e-38, size=(heads, dim)) * rng.choice([-1, 1], size=(heads, dim))]  # denormals
    rows += [np.abs(rng.normal(size=(heads, dim))), -np.abs(rng.normal(size=(heads, dim)))]
    rows += [rng.uniform(-1, 1, size=(heads, dim)) * 1.5e38]  # max - min within FLT_MAX
    grid = np.tile((np.arange(dim) - dim / 2) * (3.0 / 255.0), (heads, 1))
    rows += [grid, grid + 0.5 * 3.0 / 255.0, np.tile(np.linspace(-1, 2, dim), (heads, 1))]
    rows += [rng.integers(-3, 4, size=(heads, dim)) * 0.5]
    return np.stack(rows).astype(np.float32)


def pool_rows(fmt: str, x: Array, compute: Any = np.float32) -> tuple[dict[str, Any], Array]:
    """x written through a one-layer flat pool: (its raw rows, its values read back)."""
    n, heads, dim = x.shape
    cfg = kvcore.CacheConfig(n, [kvcore.LayerConfig(kvcore.Flat(), heads, dim)], max_step=n)
    cache = kvcore.SequenceCache(cfg)
    pool = kvcore.KVPool(cache, fmt, compute_dtype=compute)
    step = cache.begin_step(n)
    k, _, _ = pool.update(0, step, x.astype(compute), x.astype(compute))
    raw = {key: (None if v is None else np.copy(v)) for key, v in pool.read_quantized(0, step.plan(0)).items()}
    return raw, np.copy(k)


@pytest.mark.parametrize("dim", [1, 7, 64, 256])
def test_qint8_equals_executorchs_quantized_kv_cache_bit_for_bit(dim: int) -> None:
    rng = np.random.default_rng(dim)
    x = adversarial(rng, 3, dim)
    raw, values = pool_rows("qint8", x)
    q, s, z = executorch_quantize()(torch.from_numpy(x))
    np.testing.assert_array_equal(raw["k"], q.numpy())
    np.testing.assert_array_equal(raw["k_scales"].view(np.uint32), s[..., 0].numpy().view(np.uint32))
    np.testing.assert_array_equal(raw["k_zero_points"], z[..., 0].numpy())
    back = executorch_dequantize(q, s, z).numpy()
    np.testing.assert_array_equal(values.view(np.uint32), back.view(np.uint32))


@pytest.mark.parametrize("compute", [np.float16, "bfloat16"])
def test_qint8_of_half_values_is_executorchs_rule_on_their_float32_values(compute: Any) -> None:
    ml_dtypes = need("ml_dtypes")
    cdt = np.dtype(ml_dtypes.bfloat16) if compute == "bfloat16" else np.dtype(compute)
    tdt = torch.bfloat16 if compute == "bfloat16" else torch.float16
    rng = np.random.default_rng(5)
    x = rng.normal(size=(64, 2, 32)).astype(cdt)
    raw, values = pool_rows("qint8", x.astype(np.float32).astype(cdt), cdt)
    q, s, z = executorch_quantize()(torch.from_numpy(x.astype(np.float32)))
    np.testing.assert_array_equal(raw["k"], q.numpy())
    want = executorch_dequantize(q, s, z).to(tdt)
    np.testing.assert_array_equal(values.view(np.uint16), want.view(torch.int16).numpy().view(np.uint16))


def test_fp8_equals_torchs_float8_e4m3fn_cast_of_the_rule() -> None:
    rng = np.random.default_rng(8)
    x = adversarial(rng, 2, 48)
    raw, values = pool_rows("fp8_e4m3", x)
    t = torch.from_numpy(x)
    amax = t.abs().amax(dim=-1, keepdim=True)
    scale = (amax / 448.0).clamp(min=torch.finfo(torch.float32).tiny)
    q = (t / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    np.testing.assert_array_equal(raw["k"], q.view(torch.uint8).numpy())
    np.testing.assert_array_equal(raw["k_scales"].view(np.uint32), scale[..., 0].numpy().view(np.uint32))
    assert raw["k_zero_points"] is None
    back = q.to(torch.float32) * scale
    np.testing.assert_array_equal(values.view(np.uint32), back.numpy().view(np.uint32))


def test_non_finite_values_are_refused_where_executorch_would_store_garbage() -> None:
    for bad in (np.inf, -np.inf, np.nan):
        x = np.ones((1, 1, 4), np.float32)
        x[0, 0, 1] = bad
        with pytest.raises(kvcore.InvalidArgumentError, match="finite values only"):
            pool_rows("qint8", x)
    x = np.array([[[3e38, -3e38, 0.0, 1.0]]], np.float32)  # ExecuTorch: scale inf, values back as NaN
    with pytest.raises(kvcore.InvalidArgumentError, match="passes FLT_MAX"):
        pool_rows("qint8", x)
