// BatchCache.lookup_prefix, the KV event queue and kvcore.block_keys.
#include "batch_prefix.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/block_key.h"
#include "kvcore/batch/kv_events.h"
#include "prefix_namespace.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;

// The token ids of `tokens` for `verb`, with their count clamped to INT_MAX
// (more is more than any capacity: the callee refuses the clamped count).
int token_count(const IntArray& ids) { return static_cast<int>(std::min<py::ssize_t>(ids.size(), INT_MAX)); }

// One drained event as numpy's aligned structured dtype lays it out (C layout,
// 40 bytes; event_dtype() checks numpy's offsets against these once).
struct EventRow {
  std::uint8_t kind;
  std::int32_t group;
  std::uint64_t key_lo, key_hi, prefix_namespace;
  std::int32_t start, end;
};
static_assert(sizeof(EventRow) == 40 && offsetof(EventRow, group) == 4 && offsetof(EventRow, key_lo) == 8 &&
                  offsetof(EventRow, prefix_namespace) == 24 && offsetof(EventRow, start) == 32,
              "EventRow must match numpy's aligned event dtype");

// The structured dtype of drained events, one record per event, its fields
// aligned (C layout, 40 bytes). Made once per process (a drain per step would
// otherwise build it again: most of its cost), and checked field by field
// against EventRow, whose rows are copied in whole.
const py::dtype& event_dtype() {
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::dtype> storage;
  return storage
      .call_once_and_store_result([] {
        py::list fields;
        fields.append(py::make_tuple("kind", "u1"));
        fields.append(py::make_tuple("group", "<i4"));
        fields.append(py::make_tuple("key_lo", "<u8"));
        fields.append(py::make_tuple("key_hi", "<u8"));
        fields.append(py::make_tuple("namespace", "<u8"));
        fields.append(py::make_tuple("start", "<i4"));
        fields.append(py::make_tuple("end", "<i4"));
        py::dtype dt = py::module_::import("numpy").attr("dtype")(fields, py::arg("align") = true);
        const std::size_t offsets[] = {offsetof(EventRow, kind),   offsetof(EventRow, group),
                                       offsetof(EventRow, key_lo), offsetof(EventRow, key_hi),
                                       offsetof(EventRow, prefix_namespace), offsetof(EventRow, start),
                                       offsetof(EventRow, end)};
        const py::dict by_name = dt.attr("fields");
        std::size_t i = 0;
        bool same = dt.itemsize() == static_cast<py::ssize_t>(sizeof(EventRow));
        for (const char* name : {"kind", "group", "key_lo", "key_hi", "namespace", "start", "end"})
          same = same && py::cast<std::size_t>(by_name[name].cast<py::tuple>()[1]) == offsets[i++];
        if (!same) raise(kvcore::Error::Internal, "numpy's aligned KV event dtype does not match EventRow's layout");
        return dt;
      })
      .get_stored();
}

py::array drain(Cache& c, const py::handle& max_arg) {
  int max = c.kv_events().size();
  if (!max_arg.is_none()) {
    const int asked = to_int("max", py::cast<IntArg>(max_arg));
    if (asked < 0) raise(kvcore::Error::InvalidArgument, "drain_kv_events(max = " + std::to_string(asked) + "): must be >= 0");
    max = std::min(max, asked);
  }
  std::vector<kvcore::KVEvent> events(static_cast<std::size_t>(max));
  const int n = unwrap(c.drain_kv_events(events.data(), max));
  py::array out(event_dtype(), std::vector<py::ssize_t>{static_cast<py::ssize_t>(n)});
  auto* rows = static_cast<unsigned char*>(out.mutable_data());
  for (int i = 0; i < n; ++i) {
    const kvcore::KVEvent& e = events[static_cast<std::size_t>(i)];
    EventRow row;
    std::memset(&row, 0, sizeof row);  // the padding too: no indeterminate byte reaches numpy
    row.kind = static_cast<std::uint8_t>(e.kind);
    row.group = e.group;
    row.key_lo = e.key.lo;
    row.key_hi = e.key.hi;
    row.prefix_namespace = e.prefix_namespace;
    row.start = e.first_position;
    row.end = e.first_position + e.n_positions;
    std::memcpy(rows + static_cast<std::size_t>(i) * sizeof(EventRow), &row, sizeof(EventRow));
  }
  return out;
}

// The chained keys of tokens' full blocks: uint64 (n_full, 2), columns lo, hi.
py::array block_keys(const py::handle& tokens, const IntArg& block_size_arg, const py::handle& ns) {
  const int block_size = to_int("block_size", block_size_arg);
  if (block_size < 1) raise(kvcore::Error::InvalidArgument, "block_keys(block_size = " + std::to_string(block_size) + "): must be >= 1");
  const std::uint64_t space = prefix_namespace_of(ns);
  IntArray ids("block_keys", "tokens", tokens);
  const py::ssize_t full = ids.size() / block_size;
  py::array_t<std::uint64_t> out({full, static_cast<py::ssize_t>(2)});
  auto w = out.mutable_unchecked<2>();
  const std::int32_t* t = ids.int32s();
  kvcore::BlockKey key = kvcore::BlockKey::root(space);
  for (py::ssize_t i = 0; i < full; ++i) {
    key = kvcore::BlockKey::chain(key, t + i * block_size, block_size);
    w(i, 0) = key.lo;
    w(i, 1) = key.hi;
  }
  return out;
}

}  // namespace

void bind_batch_prefix(py::class_<Cache, kvcore::CacheBase, std::shared_ptr<Cache>>& cls, py::module_& m) {
  m.attr("KV_EVENT_STORED") = static_cast<int>(kvcore::KVEventKind::Stored);
  m.attr("KV_EVENT_EVICTED") = static_cast<int>(kvcore::KVEventKind::Evicted);
  m.attr("KV_EVENT_CLEARED") = static_cast<int>(kvcore::KVEventKind::Cleared);
  m.def("block_keys", &block_keys, py::arg("tokens"), py::arg("block_size"), py::arg("namespace") = py::none(),
        "The content keys of the full blocks of `tokens` (a 1-D int array or an ordered iterable of ints) "
        "in blocks of `block_size` tokens and prefix namespace `namespace` (None: 0; an int, bytes or "
        "str as add_sequence takes it): a uint64 array (len(tokens) // block_size, 2), columns (lo, hi), "
        "row i the chained key of block i, exactly the keys BatchCache names blocks by and its KV events "
        "carry. InvalidArgumentError: block_size < 1, a bad namespace or token id.");
  cls.def(
         "lookup_prefix",
         [](const Cache& c, const py::handle& tokens, const py::handle& ns) {
           const std::uint64_t space = prefix_namespace_of(ns);
           IntArray ids("lookup_prefix", "tokens", tokens);
           return unwrap(c.lookup_prefix(ids.int32s(), token_count(ids), space));
         },
         py::arg("tokens"), py::arg("namespace") = py::none(),
         "The prefix hit, in positions (a multiple of block_size; 0 on a miss), that adopt_prefix would "
         "give an empty sequence of prefix namespace `namespace` (None: 0) for `tokens` now, with no side "
         "effect: no block is held, no cached block's recency moves, a begun step stays begun. A "
         "scheduler asks it before deciding to admit. InvalidArgumentError: len(tokens) > capacity, a "
         "bad namespace or token id.")
      .def("enable_kv_events", [](Cache& c, const IntArg& capacity) { throw_if_error(c.enable_kv_events(to_int("capacity", capacity))); },
           py::arg("capacity"),
           "Keeps up to `capacity` undrained KV events from now on (0, the default: none), forgetting "
           "undrained ones and the dropped count. An event says a group stored a block key (its first "
           "block carrying it: the tokens are reusable there), evicted one (its last block carrying it "
           "was reclaimed) or that clear() forgot everything. A full queue drops new events and counts "
           "them (kv_events_dropped). InvalidArgumentError: capacity outside [0, 2**24]. AllocationError: "
           "the queue cannot be allocated (nothing changes).")
      .def("drain_kv_events", &drain, py::arg("max") = py::none(),
           "Removes and returns the oldest undrained KV events (all, or at most `max`) as a numpy "
           "structured array with fields kind (uint8: KV_EVENT_STORED, KV_EVENT_EVICTED, "
           "KV_EVENT_CLEARED), group (int32; -1 for cleared; n_groups + k for State group k's named states "
           "when BatchLimits.states_in_pool), key_lo and key_hi (uint64: the block key, "
           "as block_keys gives it), namespace (uint64), start and end (int32: the token positions "
           "[start, end) the block holds). InvalidArgumentError: max < 0.")
      .def_property_readonly("kv_events_pending", [](const Cache& c) { return c.kv_events().size(); },
                             "KV events waiting to be drained.")
      .def_property_readonly("kv_events_capacity", [](const Cache& c) { return c.kv_events().capacity(); },
                             "Undrained KV events kept at most (0: events are off).")
      .def_property_readonly("kv_events_dropped", [](const Cache& c) { return c.kv_events().dropped(); },
                             "KV events dropped because the queue was full, since enable_kv_events: when it "
                             "moves, a consumer's view of the cache is stale.");
}

}  // namespace kvcore_py
