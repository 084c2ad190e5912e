"""kvcore inside ExecuTorch's runtime: the ahead-of-time side of ``kvcore_executorch_ops``.

``kvcore_executorch_ops`` (``cpp/executorch``, built by kvcore's CMake when the executorch
wheel is installed) is a kernel library registering ``kvcache::update_and_attend.out`` into
ExecuTorch's runtime, backed by kvcore's planner and byte layer. This module:

- ``register_out_variant()``: defines ``kvcache::update_and_attend.out`` in torch, which
  ``to_executorch`` needs (without it: ``Missing out variants: {'kvcache::update_and_attend'}``);
- ``KVCoreMetadata``: the cache facts (layer kinds, windows, sinks, sources, heads, dims,
  capacity, max_step) an exported program carries as constant methods (``kvcore_*``), so the
  runtime side needs no model-specific configuration; ``from_method_reader`` reads them back;
- ``export_program``: ``torch.export`` (the token count dynamic, 1 .. max_step) ->
  ``to_edge`` (with the metadata) -> ``to_executorch`` -> ``.pte`` bytes;
- ``load_kernel_library`` / ``KernelLibrary``: loads the kernel library with ``RTLD_GLOBAL`` (so
  it registers into the ``libexecutorch.so`` that ``executorch.runtime`` uses) and drives the
  cache it serves (configure from metadata, reset, rewind, length, last error);
- ``TinyDecoder``: a tiny random decoder calling the op once per layer, with a plain PyTorch
  reference forward (explicit masks, no cache) for checking the runtime's logits.

Batch 1 and float32 for now (docs/executorch.md, "Inside ExecuTorch's runtime").
"""

from __future__ import annotations

import ctypes
import importlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

try:
    import torch

    importlib.import_module("executorch.extension.llm.cache.update_and_attend")  # defines the functional op
except ModuleNotFoundError as _missing:
    raise ModuleNotFoundError(
        f"kvcore.integrations.executorch_runtime needs torch and executorch ({_missing.name!r} is missing): "
        "pip install torch && pip install --no-deps executorch==1.5.1 && pip install ruamel.yaml flatbuffers tabulate",
        name=_missing.name,
    ) from _missing

#: The environment variable naming the built kernel library (``libkvcore_executorch_ops.so``).
KERNEL_LIBRARY_ENV = "KVCORE_EXECUTORCH_OPS"

#: kvcore's layer kinds (``kvcore::LayerPolicy::Kind``), as the metadata and the C API number them.
FLAT, RING, CHUNKED, SHARED = 0, 1, 2, 3
_KIND_NAMES = {FLAT: "flat", RING: "ring", CHUNKED: "chunked", SHARED: "shared"}
#: The K/V storage formats the kernel keeps (``kvcore::DType`` numbers): ``"int8"`` is ExecuTorch's
#: QuantizedKVCache rule (per token and head: int8 values, a float32 scale, an int8 zero point).
KV_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "int8": 5, "fp8": 6}

_OUT_SCHEMA = (
    "update_and_attend.out(Tensor q, Tensor k, Tensor v, Tensor position, SymInt layer_id, float scale, "
    "ScalarType out_dtype, *, Tensor(a!) out) -> Tensor(a!)"
)
_out_library: Optional[Any] = None  # the torch.library.Library holding the .out definition (kept alive)


def register_out_variant() -> None:
    """Define ``kvcache::update_and_attend.out`` in torch (idempotent).

    ``to_executorch`` swaps each functional op for its out variant, so a program calling
    ``kvcache::update_and_attend`` needs this before ``to_executorch``. Eagerly the out variant
    runs the functional op (ExecuTorch's registry cache) and copies into ``out``.
    """
    global _out_library
    if _out_library is not None or hasattr(torch.ops.kvcache.update_and_attend, "out"):
        return
    library: Any = torch.library  # untyped in torch's stubs
    lib = library.Library("kvcache", "FRAGMENT")
    lib.define(_OUT_SCHEMA)

    def out_impl(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        position: torch.Tensor,
        layer_id: int,
        scale: float,
        out_dtype: torch.dtype,
        *,
        out: torch.Tensor,
    ) -> torch.Tensor:
        result = torch.ops.kvcache.update_and_attend.default(q, k, v, position, layer_id, scale, out_dtype)
        out.resize_(result.shape)
        out.copy_(result)
        return out

    def out_meta(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        position: torch.Tensor,
        layer_id: int,
        scale: float,
        out_dtype: torch.dtype,
        *,
        out: torch.Tensor,
    ) -> torch.Tensor:
        return out

    lib.impl("update_and_attend.out", out_impl, "CompositeExplicitAutograd")
    lib.impl("update_and_attend.out", out_meta, "Meta")
    _out_library = lib


# --- metadata ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KVCoreMetadata:
    """What the kernel's cache needs to know of a program, carried in it as constant methods.

    ``kinds[l]``: FLAT, RING (``windows[l]`` keys a query sees counting itself, ``sinks[l]``
    first positions always seen), CHUNKED (``windows[l]`` = chunk size) or SHARED (reads layer
    ``sources[l]``'s K/V). ``n_heads``: query heads (a multiple of ``n_kv_heads``).
    ``capacity``: positions at most; ``max_step``: tokens per forward at most (the program's
    dynamic token dimension has the same bound). ``kv_dtype``: the K/V storage the program
    suggests (a ``KV_DTYPES`` number, default float32; the runtime may choose another).
    """

    kinds: tuple[int, ...]
    n_kv_heads: int
    n_heads: int
    head_dim: int
    capacity: int
    max_step: int
    windows: tuple[int, ...] = ()
    sinks: tuple[int, ...] = ()
    sources: tuple[int, ...] = ()
    v_head_dim: int = 0
    vocab_size: int = 0
    kv_dtype: int = 0

    #: The constant methods' names: ``kvcore_<field>``.
    PREFIX = "kvcore_"
    _LISTS = ("kinds", "windows", "sinks", "sources")
    _INTS = ("n_kv_heads", "n_heads", "head_dim", "v_head_dim", "capacity", "max_step", "vocab_size", "kv_dtype")

    @property
    def n_layers(self) -> int:
        """Layers of the program (one kind each)."""
        return len(self.kinds)

    def _list(self, name: str) -> list[int]:
        values = list(getattr(self, name))
        return values if values else [0] * self.n_layers

    def constant_methods(self) -> dict[str, Any]:
        """The program's metadata methods (``to_edge(constant_methods=...)``), plus ExecuTorch's
        own ``get_max_seq_len`` / ``get_vocab_size`` / ``use_kv_cache`` that its runners read."""
        out: dict[str, Any] = {self.PREFIX + name: self._list(name) for name in self._LISTS}
        out.update({self.PREFIX + name: int(getattr(self, name)) for name in self._INTS})
        out.update(get_max_seq_len=self.capacity, use_kv_cache=True, enable_dynamic_shape=True)
        if self.vocab_size:
            out["get_vocab_size"] = self.vocab_size
        return out

    @classmethod
    def from_method_reader(cls, read: Callable[[str], Any]) -> KVCoreMetadata:
        """The metadata of a program, ``read(name)`` returning a constant method's value (a list of
        ints or an int; ``kvcore_metadata(program)`` does this for ``executorch.runtime``).
        KeyError naming the method when one is missing (not exported with kvcore's metadata)."""
        def ints(name: str) -> tuple[int, ...]:
            return tuple(int(x) for x in read(cls.PREFIX + name))

        def one(name: str) -> int:
            return int(read(cls.PREFIX + name))

        return cls(
            kinds=ints("kinds"), windows=ints("windows"), sinks=ints("sinks"), sources=ints("sources"),
            n_kv_heads=one("n_kv_heads"), n_heads=one("n_heads"), head_dim=one("head_dim"),
            v_head_dim=one("v_head_dim"), capacity=one("capacity"), max_step=one("max_step"),
            vocab_size=one("vocab_size"), kv_dtype=one("kv_dtype"),
        )

    def describe(self) -> str:
        """One line per layer kind, e.g. ``flat, ring(8), flat``."""
        parts = []
        for layer, kind in enumerate(self.kinds):
            name = _KIND_NAMES.get(kind, f"kind {kind}")
            if kind == RING:
                w, s = self._list("windows")[layer], self._list("sinks")[layer]
                name += f"({w}{', sinks ' + str(s) if s else ''})"
            elif kind == CHUNKED:
                name += f"({self._list('windows')[layer]})"
            elif kind == SHARED:
                name += f"({self._list('sources')[layer]})"
            parts.append(name)
        return ", ".join(parts)


def kvcore_metadata(program: Any) -> KVCoreMetadata:
    """The ``KVCoreMetadata`` of a program loaded by ``executorch.runtime`` (its ``kvcore_*``
    constant methods). KeyError when the program was not exported with kvcore's metadata."""

    def read(name: str) -> Any:
        if name not in program.method_names:
            raise KeyError(f"the program has no method {name!r}: export it with kvcore's metadata (export_program)")
        values = program.load_method(name).execute([])
        return values if len(values) != 1 or name.endswith(("kinds", "windows", "sinks", "sources")) else values[0]

    return KVCoreMetadata.from_method_reader(read)


# --- the kernel library --------------------------------------------------------------------


class KernelLibraryError(RuntimeError):
    """A call into the kernel library failed: ``code`` is ExecuTorch's error code, the message kvcore's."""

    def __init__(self, code: int, message: str) -> None:
        """``code``: the C function's return (ExecuTorch's error code); ``message``: kvcore's."""
        super().__init__(f"{message} (ExecuTorch error 0x{code:x})")
        self.code = code


class KernelLibrary:
    """``libkvcore_executorch_ops.so`` loaded with ``RTLD_GLOBAL``: its kernel is registered in
    the process's ExecuTorch runtime; this object drives the cache the kernel serves (one,
    process-global: ``configure`` replaces it)."""

    def __init__(self, path: str) -> None:
        """Load ``path`` with ``RTLD_GLOBAL`` (registering its kernel) and bind its C functions.
        OSError when the file cannot be loaded (``load_kernel_library`` loads each path once)."""
        self.path = path
        lib = ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
        int_p = ctypes.POINTER(ctypes.c_int)
        configure_args: list[Any] = [ctypes.c_int, int_p, int_p, int_p, int_p] + [ctypes.c_int] * 7
        lib.kvcore_et_configure.argtypes = configure_args
        lib.kvcore_et_configure.restype = ctypes.c_int
        lib.kvcore_et_reset.restype = ctypes.c_int
        lib.kvcore_et_rewind.argtypes = [ctypes.c_int]
        lib.kvcore_et_rewind.restype = ctypes.c_int
        lib.kvcore_et_length.restype = ctypes.c_int
        lib.kvcore_et_nbytes.restype = ctypes.c_longlong
        lib.kvcore_et_last_error.restype = ctypes.c_char_p
        self._lib = lib

    def _check(self, code: int) -> None:
        if code != 0:
            raise KernelLibraryError(code, self.last_error)

    def configure(self, meta: KVCoreMetadata, kv_dtype: Optional[str] = None) -> None:
        """(Re)build the kernel's cache for ``meta`` at length 0, storing K/V as ``kv_dtype`` (a
        ``KV_DTYPES`` name; None: the program's ``meta.kv_dtype``). ``KernelLibraryError`` with
        kvcore's message when ``meta`` breaks a rule (the previous cache is kept); ValueError
        naming the choices for another ``kv_dtype``."""
        if kv_dtype is not None and kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype {kv_dtype!r}: must be one of {', '.join(KV_DTYPES)}")
        n = meta.n_layers

        def arr(values: Sequence[int]) -> Any:
            return (ctypes.c_int * max(n, 1))(*(list(values) or [0] * n))

        self._check(
            self._lib.kvcore_et_configure(
                n, arr(meta.kinds), arr(meta.windows), arr(meta.sinks), arr(meta.sources),
                meta.n_kv_heads, meta.head_dim, meta.v_head_dim, meta.n_heads, meta.capacity, meta.max_step,
                meta.kv_dtype if kv_dtype is None else KV_DTYPES[kv_dtype],
            )
        )

    def reset(self) -> None:
        """Length 0 (``KernelLibraryError`` when nothing is configured)."""
        self._check(self._lib.kvcore_et_reset())

    def rewind(self, length: int) -> None:
        """Back to ``length`` tokens; ``KernelLibraryError`` (nothing changed) when a ring layer no
        longer holds that history or ``length`` is outside [0, length]."""
        self._check(self._lib.kvcore_et_rewind(int(length)))

    @property
    def length(self) -> int:
        """Positions cached (-1: nothing configured)."""
        return int(self._lib.kvcore_et_length())

    @property
    def nbytes(self) -> int:
        """Bytes of the cache's K/V arena (allocated once by ``configure``)."""
        return int(self._lib.kvcore_et_nbytes())

    @property
    def last_error(self) -> str:
        """kvcore's message for the last failure (configure, rewind or the op); "" when none."""
        raw = self._lib.kvcore_et_last_error()
        return raw.decode() if raw else ""

    def release(self) -> None:
        """Drop the cache (the op then fails until ``configure``)."""
        self._lib.kvcore_et_release()


_loaded: dict[str, KernelLibrary] = {}


def find_kernel_library() -> Optional[str]:
    """The kernel library's path from ``$KVCORE_EXECUTORCH_OPS``, or None when unset.
    FileNotFoundError when set to a path that does not exist (a build that failed)."""
    path = os.environ.get(KERNEL_LIBRARY_ENV)
    if not path:
        return None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"${KERNEL_LIBRARY_ENV} = {path}: no such file (did the kvcore_executorch_ops build fail?)")
    return path


def load_kernel_library(path: Optional[str] = None) -> KernelLibrary:
    """Load the kernel library (``path``, else ``$KVCORE_EXECUTORCH_OPS``) into this process with
    ``RTLD_GLOBAL``, once per path. ExecuTorch's ``executorch.runtime`` then finds
    ``kvcache::update_and_attend.out``. FileNotFoundError when there is no library to load."""
    path = path or find_kernel_library()
    if path is None:
        raise FileNotFoundError(
            f"no kvcore_executorch_ops library: build it (cmake --build BUILD --target kvcore_executorch_ops) and set "
            f"${KERNEL_LIBRARY_ENV} to BUILD/cpp/executorch/libkvcore_executorch_ops.so"
        )
    path = os.path.realpath(path)
    if path not in _loaded:
        _loaded[path] = KernelLibrary(path)
    return _loaded[path]


# --- export --------------------------------------------------------------------------------


def export_program(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...],
    meta: KVCoreMetadata,
    dynamic_shapes: Optional[Any] = None,
) -> bytes:
    """The ``.pte`` bytes of ``model`` (which calls ``kvcache::update_and_attend``), with ``meta``
    as constant methods. ``dynamic_shapes`` as ``torch.export.export`` takes it (the token
    dimension, 1 .. meta.max_step). Uses ExecuTorch's portable path (no delegate)."""
    register_out_variant()
    exir = importlib.import_module("executorch.exir")
    with torch.no_grad():
        exported = torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes, strict=False)
    edge = exir.to_edge(
        exported,
        constant_methods=meta.constant_methods(),
        compile_config=exir.EdgeCompileConfig(_check_ir_validity=False),
    )
    return bytes(edge.to_executorch().buffer)


# --- a tiny model ---------------------------------------------------------------------------


def _rope_tables(positions: torch.Tensor, d: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, d] of the rotary embedding at ``positions`` [T] (rotate-half form)."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = positions.to(torch.float32)[:, None] * inv[None, :]  # [T, d/2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [B, H, T, D] with ``_rope_tables``' cos and sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * weight


@dataclass
class TinyConfig:
    """Shape of ``TinyDecoder``: ``kinds``/``windows``/``sinks`` per layer (``KVCoreMetadata``'s)."""

    kinds: tuple[int, ...] = (FLAT, RING, FLAT)
    windows: tuple[int, ...] = (0, 8, 0)
    sinks: tuple[int, ...] = (0, 0, 0)
    vocab_size: int = 64
    dim: int = 32
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 8
    hidden: int = 64
    capacity: int = 64
    max_step: int = 8
    seed: int = 0

    def metadata(self) -> KVCoreMetadata:
        """The cache facts a program of this model carries (``export_program`` writes them)."""
        return KVCoreMetadata(
            kinds=tuple(self.kinds), windows=tuple(self.windows), sinks=tuple(self.sinks),
            sources=(0,) * len(self.kinds), n_kv_heads=self.n_kv_heads, n_heads=self.n_heads, head_dim=self.head_dim,
            capacity=self.capacity, max_step=self.max_step, vocab_size=self.vocab_size,
        )


def _sees(kind: int, window: int, sinks: int, q: int, k: int) -> bool:
    """kvcore's visibility rule (docs/design.md sections 2 and 9) for Flat, Ring and Chunked."""
    if k > q:
        return False
    if kind == RING:
        return k < sinks or q - k < window
    if kind == CHUNKED:
        return k >= q - q % window
    return True


class TinyDecoder(torch.nn.Module):
    """A tiny random decoder (RMSNorm, GQA attention with RoPE, SiLU MLP) whose attention is
    ``kvcache::update_and_attend``: ``forward(tokens [1, T], positions [T, 1]) -> logits [1, T,
    vocab]``. ``reference(tokens [1, N])`` computes every position's logits in plain PyTorch
    from the whole sequence with explicit masks (no cache), for checking a runtime's."""

    def __init__(self, config: TinyConfig) -> None:
        """Random weights from ``config.seed`` (the same config gives the same model)."""
        super().__init__()
        self.config = c = config
        gen = torch.Generator().manual_seed(c.seed)

        def w(*shape: int, scale: float = 0.3) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape, generator=gen) * scale, requires_grad=False)

        n = len(c.kinds)
        self.embed = w(c.vocab_size, c.dim, scale=1.0)
        self.wq = torch.nn.ParameterList([w(c.n_heads * c.head_dim, c.dim) for _ in range(n)])
        self.wk = torch.nn.ParameterList([w(c.n_kv_heads * c.head_dim, c.dim) for _ in range(n)])
        self.wv = torch.nn.ParameterList([w(c.n_kv_heads * c.head_dim, c.dim) for _ in range(n)])
        self.wo = torch.nn.ParameterList([w(c.dim, c.n_heads * c.head_dim) for _ in range(n)])
        self.w1 = torch.nn.ParameterList([w(c.hidden, c.dim) for _ in range(n)])
        self.w3 = torch.nn.ParameterList([w(c.hidden, c.dim) for _ in range(n)])
        self.w2 = torch.nn.ParameterList([w(c.dim, c.hidden) for _ in range(n)])
        self.norm1 = torch.nn.ParameterList([w(c.dim, scale=0.1) for _ in range(n)])
        self.norm2 = torch.nn.ParameterList([w(c.dim, scale=0.1) for _ in range(n)])
        self.norm_out = w(c.dim, scale=0.1)
        self.head = w(c.vocab_size, c.dim)
        self.scale = 1.0 / math.sqrt(c.head_dim)

    def _layers(self, x: torch.Tensor, positions: torch.Tensor, attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        c = self.config
        B, T, _ = x.shape
        cos, sin = _rope_tables(positions, c.head_dim)
        for layer in range(len(c.kinds)):
            h = _rms(x, 1.0 + self.norm1[layer])
            q = (h @ self.wq[layer].T).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
            k = (h @ self.wk[layer].T).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
            v = (h @ self.wv[layer].T).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            o = attend(q.contiguous(), k.contiguous(), v.contiguous(), layer)
            x = x + o.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim) @ self.wo[layer].T
            h = _rms(x, 1.0 + self.norm2[layer])
            x = x + (torch.nn.functional.silu(h @ self.w1[layer].T) * (h @ self.w3[layer].T)) @ self.w2[layer].T
        return _rms(x, 1.0 + self.norm_out) @ self.head.T

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [1, T, vocab] of ``tokens`` [1, T] at ``positions`` [T, 1] (int64), the cache
        behind ``kvcache::update_and_attend`` (eagerly: ExecuTorch's registry's active cache)."""
        x = self.embed[tokens]
        op = torch.ops.kvcache.update_and_attend.default

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
            out: torch.Tensor = op(q, k, v, positions, layer, self.scale, torch.float32)
            return out

        return self._layers(x, positions[:, 0], attend)

    def reference(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of every position of ``tokens`` [1, N], from the whole sequence at once."""
        c = self.config
        N = tokens.shape[1]
        positions = torch.arange(N)
        rep = c.n_heads // c.n_kv_heads

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
            kind, window, sinks = c.kinds[layer], c.windows[layer], c.sinks[layer]
            mask = torch.tensor([[_sees(kind, window, sinks, i, j) for j in range(N)] for i in range(N)])
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            out: torch.Tensor = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
            return out

        with torch.no_grad():
            return self._layers(self.embed[tokens], positions, attend)

    def example_inputs(self, T: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs of a forward of ``T`` tokens at positions 0 .. T - 1."""
        return torch.zeros(1, T, dtype=torch.long), torch.arange(T, dtype=torch.long)[:, None]

    def dynamic_shapes(self) -> Any:
        """The token dimension dynamic, 1 .. max_step, shared by ``tokens`` and ``positions``."""
        T = torch.export.Dim("T", min=1, max=self.config.max_step)
        return {"tokens": {1: T}, "positions": {0: T}}


def export_tiny(config: Optional[TinyConfig] = None) -> tuple[TinyDecoder, bytes]:
    """A ``TinyDecoder`` for ``config`` (default: 3 layers, the middle one a ring of window 8) and
    its ``.pte`` bytes (kvcore's metadata included)."""
    config = config or TinyConfig()
    model = TinyDecoder(config).eval()
    pte = export_program(model, model.example_inputs(2), config.metadata(), model.dynamic_shapes())
    return model, pte


__all__ = [
    "CHUNKED",
    "FLAT",
    "KERNEL_LIBRARY_ENV",
    "KV_DTYPES",
    "RING",
    "SHARED",
    "KVCoreMetadata",
    "KernelLibrary",
    "KernelLibraryError",
    "TinyConfig",
    "TinyDecoder",
    "export_program",
    "export_tiny",
    "find_kernel_library",
    "kvcore_metadata",
    "load_kernel_library",
    "register_out_variant",
]
