"""kvcore's exceptions: one class per error code, all under KVCacheError.

Each also inherits the idiomatic builtin, so ``except ValueError`` keeps working.
The numeric codes equal ExecuTorch's ``executorch::runtime::Error`` values.
"""

from __future__ import annotations

import enum


class Error(enum.IntEnum):
    """kvcore's outcome codes (ExecuTorch's names and values)."""

    Ok = 0x00
    Internal = 0x01
    InvalidState = 0x02
    NotSupported = 0x10
    InvalidArgument = 0x12
    RegistrationAlreadyRegistered = 0x16
    NotFound = 0x20
    MemoryAllocationFailed = 0x21
    OutOfResources = 0x25


class KVCacheError(Exception):
    """Base of every kvcore error; ``.code`` is the kvcore.Error it stands for."""

    code: Error = Error.Internal


class InternalError(KVCacheError, RuntimeError):
    """An internal invariant broke (a bug in kvcore or in a builder)."""

    code = Error.Internal


class InvalidStateError(KVCacheError, RuntimeError):
    """The call is not valid now: a stale step, a rewind into evicted history."""

    code = Error.InvalidState


class NotSupportedError(KVCacheError, NotImplementedError):
    """The operation is not supported."""

    code = Error.NotSupported


class InvalidArgumentError(KVCacheError, ValueError):
    """An argument or config field breaks a documented rule."""

    code = Error.InvalidArgument


class AlreadyRegisteredError(KVCacheError, ValueError):
    """A key or builder with that name is already registered."""

    code = Error.RegistrationAlreadyRegistered


class NotFoundError(KVCacheError, KeyError):
    """No cache or builder with that name."""

    code = Error.NotFound

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class AllocationError(KVCacheError, MemoryError):
    """Memory could not be allocated."""

    code = Error.MemoryAllocationFailed


class CapacityError(KVCacheError, RuntimeError):
    """The sequence would exceed its capacity (a logical limit, not a MemoryError)."""

    code = Error.OutOfResources


_BY_CODE: dict[int, type[KVCacheError]] = {
    cls.code: cls
    for cls in (
        InternalError,
        InvalidStateError,
        NotSupportedError,
        InvalidArgumentError,
        AlreadyRegisteredError,
        NotFoundError,
        AllocationError,
        CapacityError,
    )
}


def error_class(code: int) -> type[KVCacheError]:
    """The exception class for a numeric code (InternalError for unknown codes)."""
    return _BY_CODE.get(code, InternalError)
