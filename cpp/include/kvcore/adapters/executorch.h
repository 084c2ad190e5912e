// ExecuTorch adapter: kvcore outcomes as executorch::runtime::Error/Result and
// back. kvcore's codes are ExecuTorch's (same names, same numbers, checked
// below at compile time), so a code converts by identity; the message a kvcore
// Status carries is sent to ExecuTorch's log (ET_LOG, Error level) when a
// failing Status is handed over, because ExecuTorch's Error has no room for it.
//
// Needs ExecuTorch's headers (executorch/runtime/core/{error,result}.h) and,
// for the log, its runtime library (libexecutorch).
#pragma once

#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/result.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kvcore/core/error.h"
#include "kvcore/core/result.h"
#include "kvcore/core/status.h"

namespace kvcore {
namespace et {

using ETError = ::executorch::runtime::Error;
template <typename T>
using ETResult = ::executorch::runtime::Result<T>;

static_assert(std::is_same<std::underlying_type<Error>::type,
                           std::underlying_type<ETError>::type>::value,
              "kvcore::Error and executorch::runtime::Error must share one integer type");

#define KVCORE_ET_SAME_CODE_(name)                                                     \
  static_assert(static_cast<std::uint32_t>(Error::name) ==                            \
                    static_cast<std::uint32_t>(ETError::name),                        \
                "kvcore::Error::" #name " must equal executorch::runtime::Error::" #name)
KVCORE_ET_SAME_CODE_(Ok);
KVCORE_ET_SAME_CODE_(Internal);
KVCORE_ET_SAME_CODE_(InvalidState);
KVCORE_ET_SAME_CODE_(NotSupported);
KVCORE_ET_SAME_CODE_(InvalidArgument);
KVCORE_ET_SAME_CODE_(RegistrationAlreadyRegistered);
KVCORE_ET_SAME_CODE_(NotFound);
KVCORE_ET_SAME_CODE_(MemoryAllocationFailed);
KVCORE_ET_SAME_CODE_(OutOfResources);
#undef KVCORE_ET_SAME_CODE_

/// The ExecuTorch code of a kvcore code (identity).
constexpr ETError to_executorch(Error code) noexcept { return static_cast<ETError>(code); }

/// True when kvcore has a code equal to `code`.
constexpr bool has_kvcore_code(ETError code) noexcept {
  switch (code) {
    case ETError::Ok:
    case ETError::Internal:
    case ETError::InvalidState:
    case ETError::NotSupported:
    case ETError::InvalidArgument:
    case ETError::RegistrationAlreadyRegistered:
    case ETError::NotFound:
    case ETError::MemoryAllocationFailed:
    case ETError::OutOfResources:
      return true;
    default:
      return false;
  }
}

/// The code of `status`; a failing status's message goes to ExecuTorch's log.
inline ETError to_executorch(const Status& status) noexcept {
  if (!status.ok()) {
    const Message message = status.message();
    if (!message.empty()) {
      ET_LOG(Error, "kvcore %s: %s", ::kvcore::to_string(status.code()), message.c_str());
    }
  }
  return to_executorch(status.code());
}

/// A kvcore Result as an ExecuTorch Result (value moved; error as above).
template <typename T>
ETResult<T> to_executorch(Result<T>&& result) {
  if (!result.ok()) return to_executorch(result.status());
  return ETResult<T>(std::move(result).get());
}

/// An ExecuTorch code as a kvcore Status. Codes kvcore does not have become
/// Internal with a message naming the ExecuTorch code.
inline Status from_executorch(ETError code) noexcept {
  if (has_kvcore_code(code)) return Status(static_cast<Error>(code));
  return Status::make(Error::Internal, "ExecuTorch error %s (0x%02x) has no kvcore equivalent",
                      ::executorch::runtime::to_string(code), static_cast<unsigned>(code));
}

/// An ExecuTorch Result as a kvcore Result (value moved; error as above).
template <typename T>
Result<T> from_executorch(ETResult<T>&& result) {
  if (!result.ok()) return from_executorch(result.error());
  return Result<T>(std::move(result.get()));
}

}  // namespace et
}  // namespace kvcore
