// Instances made by `Class.__new__(Class)` have no C++ object until __init__
// builds one; on first use pybind11 would allocate an *uninitialized* object
// and run the method on garbage (reading and writing wild memory). Every
// kvcore class refuses that allocation instead, with a TypeError.
#include <cstring>
#include <string>

#include "bindings.h"

namespace kvcore_py {

namespace {

void* refuse_uninitialized(std::size_t) {
  throw py::type_error(
      "this kvcore object was never initialized: make it by calling its class (e.g. "
      "SequenceCache(config)), not with Class.__new__(Class)");
}

}  // namespace

void guard_uninitialized(py::module_& m) {
  const std::string prefix = m.attr("__name__").cast<std::string>() + ".";
  for (auto& entry : py::detail::get_internals().registered_types_py) {
    if (std::strncmp(entry.first->tp_name, prefix.c_str(), prefix.size()) != 0) continue;
    for (py::detail::type_info* type : entry.second) type->operator_new = &refuse_uninitialized;
  }
}

}  // namespace kvcore_py
