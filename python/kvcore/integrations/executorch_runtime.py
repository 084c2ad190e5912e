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
  ``to_edge`` (with the metadata) -> ``to_executorch`` -> ``.pte`` bytes; with
  ``forward_last=True`` also a method ``forward_last`` (``FORWARD_LAST``: the last position's
  logits only, ``[1, 1, vocab]``, for prefill), sharing ``forward``'s weights in the program;
- ``load_kernel_library`` / ``KernelLibrary``: loads the kernel library with ``RTLD_GLOBAL`` (so
  it registers into the ``libexecutorch.so`` that ``executorch.runtime`` uses) and drives the
  cache it serves (configure from metadata, reset, rewind, length, last error);
``kvcore.integrations.executorch_tiny`` builds a tiny random decoder on it for checks and demos.

Batch 1 for now (docs/executorch.md, "Inside ExecuTorch's runtime").
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from kvcore._errors import InvalidArgumentError

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
    ``forward_last``: 1 when the program has the method ``forward_last`` (``FORWARD_LAST``:
    ``forward``'s signature, the last position's logits only, ``[1, 1, vocab]``), 0 when not;
    a program exported before it existed has no ``kvcore_forward_last`` and reads as 0.
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
    forward_last: int = 0

    #: The constant methods' names: ``kvcore_<field>``.
    PREFIX = "kvcore_"
    _LISTS = ("kinds", "windows", "sinks", "sources")
    _INTS = ("n_kv_heads", "n_heads", "head_dim", "v_head_dim", "capacity", "max_step", "vocab_size", "kv_dtype",
             "forward_last")  # fmt: skip
    #: Methods a program may lack (written by later exports): read as 0 when missing.
    _OPTIONAL = ("forward_last",)

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
        ints or an int, KeyError when the program has no such method; ``kvcore_metadata(program)``
        does this for ``executorch.runtime``). KeyError naming the method when one is missing (not
        exported with kvcore's metadata), except ``kvcore_forward_last``, which programs exported
        before it lack: 0 then."""
        def ints(name: str) -> tuple[int, ...]:
            return tuple(int(x) for x in read(cls.PREFIX + name))

        def one(name: str) -> int:
            try:
                return int(read(cls.PREFIX + name))
            except KeyError:
                if name in cls._OPTIONAL:
                    return 0
                raise

        return cls(
            kinds=ints("kinds"), windows=ints("windows"), sinks=ints("sinks"), sources=ints("sources"),
            n_kv_heads=one("n_kv_heads"), n_heads=one("n_heads"), head_dim=one("head_dim"),
            v_head_dim=one("v_head_dim"), capacity=one("capacity"), max_step=one("max_step"),
            vocab_size=one("vocab_size"), kv_dtype=one("kv_dtype"), forward_last=one("forward_last"),
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
        lib.kvcore_et_set_threads.argtypes = [ctypes.c_int]
        lib.kvcore_et_set_threads.restype = ctypes.c_int
        lib.kvcore_et_threads.restype = ctypes.c_int
        lib.kvcore_et_set_min_task_work.argtypes = [ctypes.c_longlong]
        lib.kvcore_et_set_min_task_work.restype = ctypes.c_int
        self._lib = lib

    def _check(self, code: int) -> None:
        if code != 0:
            raise KernelLibraryError(code, self.last_error)

    @staticmethod
    def _c_int(what: str, value: Any, bits: int) -> int:
        """`value` as a C integer of `bits` bits: an int (not a bool) in its range, else
        InvalidArgumentError naming `what` (ctypes would truncate it silently, or take a float's
        integer part); the kernel checks the rest."""
        lo, hi = -(1 << (bits - 1)), 1 << (bits - 1)
        try:
            n = None if isinstance(value, bool) else operator.index(value)
        except TypeError:
            n = None
        if n is None or not lo <= n < hi:
            raise InvalidArgumentError(f"{what} = {value!r}: must be an int in [{lo}, {hi})")
        return n

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

    def set_threads(self, threads: int) -> None:
        """Attend with ``threads`` workers (the runtime's calling thread and ``threads - 1`` threads
        of the kernel's own, started once; 0: one per processor online, the default; 1: the
        calling thread alone), for the configured cache and those configured later; the cached
        rows are kept. ``InvalidArgumentError`` when ``threads`` is not an int of a C int's range;
        ``KernelLibraryError`` (nothing changed) when it is outside [0, 256] or a forward is
        under way."""
        self._check(self._lib.kvcore_et_set_threads(self._c_int("threads", threads, 32)))

    def set_min_task_work(self, multiply_adds: int) -> None:
        """The least work (multiply-adds) worth an attention task of its own in the configured
        cache (0: one task per worker whatever the size, as the tests use to cut a tiny
        model's layers; ``configure`` restores the default). ``InvalidArgumentError`` when
        ``multiply_adds`` is not a 64-bit int; ``KernelLibraryError`` when nothing is configured
        or ``multiply_adds`` < 0."""
        self._check(self._lib.kvcore_et_set_min_task_work(self._c_int("multiply_adds", multiply_adds, 64)))

    @property
    def threads(self) -> int:
        """Attention workers of the configured cache (the calling thread counted), or of the next
        one configured when none is (0: one per processor online)."""
        return int(self._lib.kvcore_et_threads())

    def reset(self) -> None:
        """Length 0 (``KernelLibraryError`` when nothing is configured)."""
        self._check(self._lib.kvcore_et_reset())

    def rewind(self, length: int) -> None:
        """Back to ``length`` tokens; ``InvalidArgumentError`` when ``length`` is not an int of a C
        int's range; ``KernelLibraryError`` (nothing changed) when a ring layer no longer holds
        that history or ``length`` is outside [0, length]."""
        self._check(self._lib.kvcore_et_rewind(self._c_int("length", length, 32)))

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


#: The name of the prefill method returning only the last position's logits.
FORWARD_LAST = "forward_last"


class _ForwardLast(torch.nn.Module):
    """``model.forward_last`` as a module's ``forward`` (what ``torch.export`` exports); the
    parameters are ``model``'s own, so the program holds them once."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = getattr(self.model, FORWARD_LAST)(tokens, positions)
        return out


def export_program(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...],
    meta: KVCoreMetadata,
    dynamic_shapes: Optional[Any] = None,
    preserve_ops: Sequence[Any] = (),
    forward_last: bool = False,
) -> bytes:
    """The ``.pte`` bytes of ``model`` (which calls ``kvcache::update_and_attend``), with ``meta``
    as constant methods. ``dynamic_shapes`` as ``torch.export.export`` takes it (the token
    dimension, 1 .. meta.max_step). ``preserve_ops``: aten ops ``to_edge`` keeps whole instead of
    decomposing (``aten.linear.default``: the runtime's optimized ``linear`` kernel, where the
    decomposition copies each weight transposed in every forward). Uses ExecuTorch's CPU kernels
    (no delegate).

    ``forward_last=True``: the program also has the method ``forward_last`` (``FORWARD_LAST``),
    ``model.forward_last(tokens, positions)`` exported with the same inputs, dynamic shapes and
    cache op (one kvcore step per call, as ``forward``), which must return only the last
    position's logits ``[1, 1, vocab]``; the metadata's ``forward_last`` is set to 1 (else 0).
    Both methods read the same weights: ExecuTorch's emitter stores a constant whose bytes it
    has stored already once (a SHA-256 of the bytes), so the program grows by the second
    method's instructions, not by its weights. AttributeError when ``model`` has no
    ``forward_last``."""
    register_out_variant()
    exir = importlib.import_module("executorch.exir")
    if forward_last and not callable(getattr(model, FORWARD_LAST, None)):
        raise AttributeError(f"export_program(forward_last=True): {type(model).__name__} has no method {FORWARD_LAST}")
    meta = dataclasses.replace(meta, forward_last=int(forward_last))
    with torch.no_grad():
        exported: Any = torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes, strict=False)
        if forward_last:
            last = torch.export.export(_ForwardLast(model), example_inputs, dynamic_shapes=dynamic_shapes, strict=False)
            exported = {"forward": exported, FORWARD_LAST: last}
    edge = exir.to_edge(
        exported,
        constant_methods=meta.constant_methods(),
        compile_config=exir.EdgeCompileConfig(_check_ir_validity=False, _core_aten_ops_exception_list=list(preserve_ops),
                                              preserve_ops=list(preserve_ops)),  # fmt: skip
    )
    return bytes(edge.to_executorch().buffer)


__all__ = [
    "CHUNKED",
    "FLAT",
    "FORWARD_LAST",
    "KERNEL_LIBRARY_ENV",
    "KV_DTYPES",
    "RING",
    "SHARED",
    "KVCoreMetadata",
    "KernelLibrary",
    "KernelLibraryError",
    "export_program",
    "find_kernel_library",
    "kvcore_metadata",
    "load_kernel_library",
    "register_out_variant",
]
