// Sequence records (docs/state.md) apart from any pool: check_record and seal_record.
#include <pybind11/numpy.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "kvcore/state/sequence_export.h"
#include "kvcore/state/sequence_import.h"
#include "record_io.h"

namespace kvcore_py {

void register_records(py::module_& m) {
  m.def(
      "check_record",
      [](py::object record) {
        const RecordBytes r(record);
        throw_if_error(kvcore::RecordView::parse(r.data, r.size).status());
      },
      py::arg("record"),
      "Validates a sequence record (docs/state.md) as an import does before reading it: size, magic, "
      "version, checksum and every field. InvalidArgumentError: truncated, corrupt or malformed (the "
      "message names the field); NotSupportedError: a version newer than this build reads.");

  m.def(
      "seal_record",
      [](py::object out) {
        // A writer outside the core (the torch pools) fills a record's rows and seals it here.
        constexpr std::size_t kMin = kvcore::RecordFormat::kHeaderBytes + kvcore::RecordFormat::kTrailerBytes;
        const OutputBuffer buffer("seal_record", out, kMin);
        const std::size_t body = buffer.bytes - kvcore::RecordFormat::kTrailerBytes;
        unsigned char* bytes = buffer.data;
        kvcore::record_detail::put_u64(bytes + body, kvcore::record_checksum(bytes, body));
      },
      py::arg("out"),
      "Writes the checksum of the record in the buffer `out` (its last 8 bytes, over every byte "
      "before them), for a writer that filled a record's rows itself. InvalidArgumentError: out not "
      "a buffer, read-only, not C-contiguous, or shorter than 72 bytes.");

}

}  // namespace kvcore_py
