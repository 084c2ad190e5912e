// PagedKVPool's records (docs/state.md): a sequence exported as bytes, and imported (shared prefixes kept shared).
#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "batch_step_handle.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/state/sequence_export.h"
#include "kvcore/state/sequence_import.h"
#include "numpy_dtype.h"
#include "py_paged_kv_pool.h"
#include "prefix_namespace.h"
#include "record_io.h"
#include "state_tensors.h"

namespace kvcore_py {

void bind_paged_kv_pool_records(py::class_<PyPagedPool>& cls) {
  cls
      .def(
          "export_size",
          [](const PyPagedPool& p, const PyInt& seq, const PyInt& n_tokens) {
            return unwrap(kvcore::export_size(*p.cache(), p.pool(), to_int("seq", seq), to_int("n_tokens", n_tokens)));
          },
          py::arg("seq"), py::arg("n_tokens") = 0,
          "Bytes export_sequence(seq) gives with `n_tokens` known token ids. InvalidArgumentError: bad "
          "seq, n_tokens outside [0, length]; InvalidStateError: seq not active.")
      .def(
          "export_sequence",
          [](const PyPagedPool& p, const PyInt& seq_arg, py::object tokens) {
            const int seq = to_int("seq", seq_arg);
            const std::vector<std::int32_t> t = token_ids_of("export_sequence", tokens);
            const int n = static_cast<int>(t.size());
            const std::size_t size = unwrap(kvcore::export_size(*p.cache(), p.pool(), seq, n));
            return new_record(size, [&](void* out) {
              throw_if_error(kvcore::export_to(*p.cache(), p.pool(), seq, t.data(), n, out, size));
            });
          },
          py::arg("seq"), py::arg("tokens") = py::none(),
          "Sequence `seq` as a record (bytes, docs/state.md): length, removed head and holes, per layer "
          "the rows its group still holds (a ring's sink blocks and window, not what it released) and "
          "`tokens` (the ids of positions [0, len(tokens)), optional, a 1-D int32 or int64 array or a list "
          "of ints, copied and never cast; with all of them an importer can share a prefix it caches). "
          "InvalidArgumentError: bad seq, more tokens than the length, tokens of another dtype or shape, an "
          "id beyond 32 bits; TypeError: a list item that is not an int; InvalidStateError: seq not "
          "active, or a step is begun.")
      .def(
          "export_into",
          [](const PyPagedPool& p, const PyInt& seq_arg, py::object out, py::object tokens) {
            const int seq = to_int("seq", seq_arg);
            const std::vector<std::int32_t> t = token_ids_of("export_into", tokens);
            const int n = static_cast<int>(t.size());
            const std::size_t size = unwrap(kvcore::export_size(*p.cache(), p.pool(), seq, n));
            const OutputBuffer buffer("export_into", out, size);
            throw_if_error(kvcore::export_to(*p.cache(), p.pool(), seq, t.data(), n, buffer.data, size));
            return size;
          },
          py::arg("seq"), py::arg("out"), py::arg("tokens") = py::none(),
          "Writes export_sequence(seq)'s record into the first bytes of the buffer `out` (writable, "
          "C-contiguous, 8-byte aligned, at least export_size() bytes) and returns its size in bytes. InvalidArgumentError: "
          "out not a buffer, read-only, not C-contiguous, misaligned or too small, checked before anything "
          "is written; errors as export_sequence.")
      .def(
          "import_sequence",
          [](PyPagedPool& p, const PyInt& seq, py::object record, bool written, bool trust_tokens,
             const py::handle& ns) -> py::object {
            const int s = to_int("seq", seq);
            const kvcore::RecordTrust trust{trust_tokens || !ns.is_none(), prefix_namespace_of(ns)};
            const RecordBytes r(record);
            if (!written) {
              throw_if_error(kvcore::import_record(r.data, r.size, *p.cache(), p.pool(), s, trust));
              return py::none();
            }
            return import_reporting(p, s, r, trust);
          },
          py::arg("seq"), py::arg("record"), py::kw_only(), py::arg("written") = false,
          py::arg("trust_tokens") = false, py::arg("namespace") = py::none(),
          "Admits the sequence of `record` (any bytes-like object; any block size, from a BatchCache or "
          "a SequenceCache) as sequence `seq` (inactive): its length, removed head, holes and rows. "
          "A record's token ids are its sender's word: by default the sequence names no block by them "
          "and shares none with this cache's prefixes (an untrusted record cannot change what a later "
          "request reads). trust_tokens=True, or a `namespace` (as add_sequence's; trust_tokens then "
          "implied), names its full blocks by the record's token ids in that namespace (default: 0) "
          "and shares the blocks of a prefix this cache holds there (when the record knows every "
          "token id), not copied. Every later plan and read equals the exporter's, and so does every can_rewind "
          "answer the record reaches (a ring's window and sinks, a State layer's run of states ending at the "
          "last one). Checks "
          "everything first and changes nothing on an error (any begun step ends on success). "
          "InvalidArgumentError: truncated, corrupt (checksum), bad magic, a policy, shape or dtype "
          "other than the cache's; NotSupportedError: a newer record version, or a ring group whose sink "
          "blocks would keep a position the record lacks; InvalidStateError: seq is active; "
          "CapacityError: no free table row (batch.max_active_seqs sequences are active), length "
          "over capacity, too many holes, too few free blocks; InvalidArgumentError also: a bad "
          "namespace.\n\n"
          "written=True: returns the blocks the import wrote, an int32 (n, 3) array of rows (group, "
          "block index in the sequence, block id): every block of the sequence but the shared ones (a "
          "byte layer keeping its own copy of the rows, as TorchPagedKVPool, writes exactly these). None "
          "otherwise.");
}

}  // namespace kvcore_py
