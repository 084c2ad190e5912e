// A prefix namespace at the Python boundary (docs/batch.md "Prefix namespaces"):
// None (the default namespace, 0), an int in [0, 2**64), or bytes / str
// (UTF-8) hashed once with BLAKE2b (8-byte digest, personalized), so that a
// tenant's, adapter's or model revision's name is its namespace.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "errors.h"

namespace kvcore_py {

namespace py = pybind11;

/// The 64-bit prefix namespace `ns` names. InvalidArgumentError: a bool, an
/// int outside [0, 2**64), or another type.
inline std::uint64_t prefix_namespace_of(py::handle ns) {
  if (ns.is_none()) return 0;
  if (py::isinstance<py::bool_>(ns))
    raise(kvcore::Error::InvalidArgument, "namespace: must be None, an int in [0, 2**64), bytes or str, not a bool");
  if (py::isinstance<py::int_>(ns)) {
    const py::int_ v = py::reinterpret_borrow<py::int_>(ns);
    if (v < py::int_(0) || v >= py::int_(1).attr("__lshift__")(64))
      raise(kvcore::Error::InvalidArgument,
            "namespace = " + py::str(ns).cast<std::string>() + ": an int namespace must be in [0, 2**64)");
    return v.cast<std::uint64_t>();
  }
  if (py::isinstance<py::str>(ns) || py::isinstance<py::bytes>(ns)) {
    const py::object data = py::isinstance<py::str>(ns) ? ns.attr("encode")("utf-8") : py::reinterpret_borrow<py::object>(ns);
    const py::object digest = py::module_::import("hashlib")
                                  .attr("blake2b")(data, py::arg("digest_size") = 8,
                                                   py::arg("person") = py::bytes("kvcore-ns"))
                                  .attr("digest")();
    return py::int_(py::module_::import("builtins").attr("int").attr("from_bytes")(digest, "little")).cast<std::uint64_t>();
  }
  raise(kvcore::Error::InvalidArgument, "namespace: must be None, an int in [0, 2**64), bytes or str, not " +
                                            py::str(py::type::handle_of(ns).attr("__name__")).cast<std::string>());
}

}  // namespace kvcore_py
