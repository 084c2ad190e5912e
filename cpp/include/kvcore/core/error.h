// Outcome codes. Names and numeric values equal ExecuTorch's
// `executorch::runtime::Error`, so the ExecuTorch adapter is a checked identity.
#pragma once

#include <cstdint>

namespace kvcore {

enum class Error : std::uint32_t {
  // System errors.
  /// Success.
  Ok = 0x00,
  /// An internal invariant broke (a bug, or a builder that returned nothing).
  Internal = 0x01,
  /// The call is not valid in the current state (stale step, rewind into evicted history).
  InvalidState = 0x02,

  // Logical errors.
  /// The operation is not supported.
  NotSupported = 0x10,
  /// An argument or a config field breaks a documented rule.
  InvalidArgument = 0x12,
  /// A key or builder with that name is already registered.
  RegistrationAlreadyRegistered = 0x16,

  // Resource errors.
  /// No cache or builder with that name.
  NotFound = 0x20,
  /// Memory could not be allocated.
  MemoryAllocationFailed = 0x21,
  /// A logical limit is exhausted (the sequence would exceed its capacity).
  OutOfResources = 0x25,
};

/// The enumerator's name, e.g. "InvalidArgument"; "Unknown" for values outside the enum.
constexpr const char* to_string(Error e) noexcept {
  switch (e) {
    case Error::Ok: return "Ok";
    case Error::Internal: return "Internal";
    case Error::InvalidState: return "InvalidState";
    case Error::NotSupported: return "NotSupported";
    case Error::InvalidArgument: return "InvalidArgument";
    case Error::RegistrationAlreadyRegistered: return "RegistrationAlreadyRegistered";
    case Error::NotFound: return "NotFound";
    case Error::MemoryAllocationFailed: return "MemoryAllocationFailed";
    case Error::OutOfResources: return "OutOfResources";
  }
  return "Unknown";
}

}  // namespace kvcore
