// Names kept one release for compatibility (docs/deprecations.md): a binding of
// an old name warns, then does what the new name does.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace kvcore_py {

namespace py = pybind11;

/// Warns DeprecationWarning "OLD is deprecated: use NEW (removed in kvcore 0.2.0)"
/// for a name kept one release for compatibility; raises the warning (as the
/// error_already_set pybind11 turns back into it) when warnings are errors.
inline void warn_deprecated(const char* old_name, const char* new_name) {
  const std::string message =
      std::string(old_name) + " is deprecated: use " + new_name + " (removed in kvcore 0.2.0)";
  if (PyErr_WarnEx(PyExc_DeprecationWarning, message.c_str(), 1) != 0) throw py::error_already_set();
}

}  // namespace kvcore_py
