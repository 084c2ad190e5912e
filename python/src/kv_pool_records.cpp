// KVPool's records (docs/state.md): the cache's sequence exported as bytes, and imported.
#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "py_kv_pool.h"
#include "kvcore/state/sequence_export.h"
#include "kvcore/state/sequence_import.h"
#include "numpy_dtype.h"
#include "record_io.h"
#include "state_tensors.h"
#include "step_handle.h"

namespace kvcore_py {

void bind_kv_pool_records(py::class_<PyPool>& cls) {
  cls
      .def(
          "export_size",
          [](const PyPool& p, const PyInt& n_tokens) {
            return unwrap(kvcore::export_size(*p.cache(), p.pool(), to_int("n_tokens", n_tokens)));
          },
          py::arg("n_tokens") = 0,
          "Bytes export_sequence() gives for the cache's sequence with `n_tokens` known token ids. "
          "InvalidArgumentError: n_tokens outside [0, length].")
      .def(
          "export_sequence",
          [](const PyPool& p, py::object tokens) {
            const std::vector<std::int32_t> t = token_ids_of("export_sequence", tokens);
            const int n = static_cast<int>(t.size());
            const std::size_t size = unwrap(kvcore::export_size(*p.cache(), p.pool(), n));
            return new_record(size, [&](void* out) {
              throw_if_error(kvcore::export_to(*p.cache(), p.pool(), t.data(), n, out, size));
            });
          },
          py::arg("tokens") = py::none(),
          "The cache's sequence as a record (bytes, docs/state.md): length, per layer the rows its "
          "layer still holds (a ring's sinks and window, not what it released; a Shared layer none; a "
          "State layer its states after positions [held_from, length): the last one and the run of held "
          "states before it, what a rewind needs; record version 3) and `tokens` (the ids of "
          "positions [0, len(tokens)), optional: a 1-D int32 or int64 array or a list of ints, copied; "
          "never cast from floats, bools or strings). InvalidArgumentError: more tokens than the length, "
          "tokens of another dtype or shape, an id beyond 32 bits; TypeError: a list item that is not an "
          "int; InvalidStateError: a step is begun.")
      .def(
          "export_into",
          [](const PyPool& p, py::object out, py::object tokens) {
            const std::vector<std::int32_t> t = token_ids_of("export_into", tokens);
            const int n = static_cast<int>(t.size());
            const std::size_t size = unwrap(kvcore::export_size(*p.cache(), p.pool(), n));
            const OutputBuffer buffer("export_into", out, size);
            throw_if_error(kvcore::export_to(*p.cache(), p.pool(), t.data(), n, buffer.data, size));
            return size;
          },
          py::arg("out"), py::arg("tokens") = py::none(),
          "Writes the record export_sequence() gives into the first bytes of the buffer `out` (writable, "
          "C-contiguous, 8-byte aligned, at least export_size() bytes, e.g. a numpy uint8 array) and "
          "returns its size in bytes. InvalidArgumentError: out not a buffer, read-only, not C-contiguous "
          "(a strided, negative-stride, stride-0 or Fortran-ordered view), misaligned or too small, checked "
          "before anything is written; errors as export_sequence.")
      .def(
          "import_sequence",
          [](PyPool& p, py::object record) {
            const RecordBytes r(record);
            throw_if_error(kvcore::import_record(r.data, r.size, *p.cache(), p.pool()));
          },
          py::arg("record"),
          "Admits the sequence of `record` (any bytes-like object) into the empty cache and this pool: "
          "its length, rows and states; every later plan and read equals the exporter's, and can_rewind "
          "allows what the record carries (never more than the exporter). Checks everything first and "
          "changes nothing on an error. InvalidArgumentError: truncated, corrupt (checksum), bad magic, or "
          "a policy, shape or dtype other than the cache's (a State layer: D or the bytes of its state "
          "tensors); "
          "NotSupportedError: a newer record version, or a record with holes or a removed head; "
          "InvalidStateError: the cache holds positions or a begun step; CapacityError: its "
          "length exceeds the capacity.");
}

}  // namespace kvcore_py
