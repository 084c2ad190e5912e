// BatchCache.lookup_prefix, the KV event queue and kvcore.block_keys.
#include "batch_prefix.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <climits>
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

// The structured dtype of drained events, one record per event, its fields
// aligned (C layout, 40 bytes): the columns are written through typed
// references, which a packed record would misalign.
py::object event_dtype() {
  py::list fields;
  fields.append(py::make_tuple("kind", "u1"));
  fields.append(py::make_tuple("group", "<i4"));
  fields.append(py::make_tuple("key_lo", "<u8"));
  fields.append(py::make_tuple("key_hi", "<u8"));
  fields.append(py::make_tuple("namespace", "<u8"));
  fields.append(py::make_tuple("start", "<i4"));
  fields.append(py::make_tuple("end", "<i4"));
  return py::module_::import("numpy").attr("dtype")(fields, py::arg("align") = true);
}

// Writes get(event) into column `name` of the structured array `out`.
template <class T, class Get>
void fill_column(py::array& out, const char* name, const std::vector<kvcore::KVEvent>& events, Get get) {
  py::array column = out[py::str(name)];
  auto w = column.mutable_unchecked<T, 1>();
  for (py::ssize_t i = 0; i < static_cast<py::ssize_t>(events.size()); ++i)
    w(i) = get(events[static_cast<std::size_t>(i)]);
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
  events.resize(static_cast<std::size_t>(n));
  py::array out = py::module_::import("numpy").attr("empty")(n, event_dtype());
  fill_column<std::uint8_t>(out, "kind", events, [](const kvcore::KVEvent& e) { return static_cast<std::uint8_t>(e.kind); });
  fill_column<std::int32_t>(out, "group", events, [](const kvcore::KVEvent& e) { return e.group; });
  fill_column<std::uint64_t>(out, "key_lo", events, [](const kvcore::KVEvent& e) { return e.key.lo; });
  fill_column<std::uint64_t>(out, "key_hi", events, [](const kvcore::KVEvent& e) { return e.key.hi; });
  fill_column<std::uint64_t>(out, "namespace", events, [](const kvcore::KVEvent& e) { return e.prefix_namespace; });
  fill_column<std::int32_t>(out, "start", events, [](const kvcore::KVEvent& e) { return e.first_position; });
  fill_column<std::int32_t>(out, "end", events, [](const kvcore::KVEvent& e) { return e.first_position + e.n_positions; });
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
           "KV_EVENT_CLEARED), group (int32; -1 for cleared), key_lo and key_hi (uint64: the block key, "
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
