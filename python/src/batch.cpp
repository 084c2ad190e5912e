// Python view of BatchCache (many sequences over paged block pools), its steps
// and their plans. A plan's arrays are read-only numpy views of the cache's
// own buffers (no copy); each keeps the cache alive, and shows the step it was
// made for until the cache's next mutating call.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "batch_arrays.h"
#include "batch_prefix.h"
#include "batch_step_handle.h"
#include "bindings.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"
#include "plan_mask.h"
#include "prefix_namespace.h"
#include "tree_binding.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

// A read-only int32 view of the ints at `data` (C order, shape `shape`: one
// or two sizes), kept alive by `owner`. Made through numpy's C API: a plan's
// arrays are read every step, and pybind11's array constructor costs twice this.
py::array view_of(const void* data, std::initializer_list<py::ssize_t> shape, py::handle owner,
                  int type = py::detail::npy_api::NPY_INT_ /* C int: int32 */) {
  auto& api = py::detail::npy_api::get();
  Py_intptr_t dims[2] = {0, 0};
  int nd = 0;
  for (py::ssize_t size : shape) dims[nd++] = size;
  PyObject* descr = api.PyArray_DescrFromType_(type);
  PyObject* arr = api.PyArray_NewFromDescr_(api.PyArray_Type_, descr, nd, dims, nullptr, const_cast<void*>(data),
                                            0 /* flags: read-only */, nullptr);
  if (arr == nullptr) throw py::error_already_set();
  py::array out = py::reinterpret_steal<py::array>(arr);
  py::detail::array_proxy(arr)->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;  // data null: numpy's own
  if (api.PyArray_SetBaseObject_(arr, owner.inc_ref().ptr()) != 0) throw py::error_already_set();
  return out;
}

// plan.arrays() is read every step, and a decode step's arrays are the same
// buffers with the same shapes step after step: each cache keeps the views it
// last handed out (and the tuple holding them) and hands them out again while
// every pointer and shape matches, instead of making a dozen new numpy arrays
// per step. They are the same read-only views of the same memory a fresh call
// would make. Their base is a capsule holding the cache's shared_ptr (not the
// Python cache, which the memo would then keep alive for good); the memo goes
// when the Python cache object does (a weakref callback), so the C++ cache
// lives exactly while a view, a step or the Python object holds it.
class PlanViewMemo {
 public:
  struct Key {
    const void* data = nullptr;
    py::ssize_t dims[2] = {-1, -1};
    bool operator==(const Key& o) const { return data == o.data && dims[0] == o.dims[0] && dims[1] == o.dims[1]; }
  };

  // The memo of `cache` (its Python object `owner`), made on first use.
  static PlanViewMemo& of(const CachePtr& cache, py::handle owner) {
    auto& all = memos();
    auto it = all.find(cache.get());
    if (it != all.end()) return it->second;
    PlanViewMemo& m = all[cache.get()];
    m.keeper_ = py::capsule(new CachePtr(cache), [](void* p) { delete static_cast<CachePtr*>(p); });
    const Cache* key = cache.get();
    // pybind11's keep_alive pattern: the weakref holds itself until its callback runs.
    py::weakref(owner, py::cpp_function([key](py::handle weakref) {
      memos().erase(key);
      weakref.dec_ref();
    })).release();
    return m;
  }

  // The view of slot i for `key` (a new one when the key changed) and whether it was reused.
  py::object view(std::size_t i, const Key& key, int type, bool* reused) {
    if (i >= slots_.size()) slots_.resize(i + 1);
    Slot& s = slots_[i];
    if (s.view && s.key == key) return s.view;
    *reused = false;
    const int nd = key.dims[1] < 0 ? 1 : 2;
    s.view = view_of(key.data, nd == 1 ? std::initializer_list<py::ssize_t>{key.dims[0]}
                                       : std::initializer_list<py::ssize_t>{key.dims[0], key.dims[1]},
                     keeper_, type);
    s.key = key;
    return s.view;
  }

  py::object& tuple() { return tuple_; }

 private:
  struct Slot {
    Key key;
    py::object view;
  };
  // Never destroyed: its objects must not be released after the interpreter ends.
  static std::unordered_map<const Cache*, PlanViewMemo>& memos() {
    static auto* all = new std::unordered_map<const Cache*, PlanViewMemo>();
    return *all;
  }

  py::object keeper_;  // the views' base
  std::vector<Slot> slots_;
  py::object tuple_;   // the last tuple handed out, while every view in it was reused
};

// What plan.arrays() returns (its signature as the typed tuple make_tuple gives).
using PlanArrays = py::typing::Tuple<py::array, py::array, py::array, py::array, py::array, py::array, py::tuple>;

// One group's part of a plan.
struct GroupPlanHandle {
  BatchStepHandle step;  // the step it was made for
  int group = 0;
  kvcore::GroupPlan plan;

  int n_tokens() const { return step.step.n_tokens; }  // the step's, as its plan's
};

// One State group's part of a plan.
struct StateGroupPlanHandle {
  BatchStepHandle step;  // the step it was made for
  int state_group = 0;
  kvcore::StateGroupPlan plan;

  int n_tokens() const { return step.step.n_tokens; }
};

// The plan of a step, as Python sees it.
struct BatchPlanHandle {
  BatchStepHandle step;  // the step it was made for
  kvcore::BatchStepPlan plan;
};

// A sequence's state copied out of the cache: kvcore::SequenceInfo points into
// the cache's hole table, which later calls change and the cache's end frees.
struct SequenceSnapshot {
  bool active = false;
  int length = 0;
  int visible_start = 0;
  int visible_positions = 0;
  std::vector<kvcore::PositionRange> holes;
};

SequenceSnapshot snapshot_of(const kvcore::SequenceInfo& s) {
  SequenceSnapshot out{s.active, s.length, s.visible_start, s.visible_positions(), {}};
  out.holes.assign(s.holes, s.holes + s.n_holes);
  return out;
}

const kvcore::BatchStepPlan& current(const BatchPlanHandle& h) {
  throw_if_error(h.step.check());  // a plan of an ended step is stale
  return h.plan;
}

// An entry index of the plan: InvalidArgumentError outside [0, n_entries).
int entry_of(const kvcore::BatchStepPlan& p, const IntArg& entry) {
  const int i = to_int("entry", entry);
  if (i < 0 || i >= p.n_entries)
    raise(kvcore::Error::InvalidArgument,
          "entry = " + std::to_string(i) + ": must be >= 0 and < n_entries = " + std::to_string(p.n_entries));
  return i;
}

// The token ids of `tokens` (any iterable). An item that is not an int goes to
// `refuse`, which throws the caller's TypeError (its message names the call;
// each stays a literal at its throw, where test_errors_doc finds it).
template <typename Refuse>
std::vector<std::int32_t> token_ids(const py::handle& tokens, Refuse refuse) {
  std::vector<std::int32_t> out;
  for (py::handle x : tokens) {
    const std::optional<PyInt> id = as_index(x);
    if (!id) refuse(x);  // throws
    out.push_back(to_int("token", *id));
  }
  return out;
}

// Entry `seq`'s parents (any iterable of ints), T of them.
std::vector<int> parent_ids(const py::handle& parents, int seq, int T) {
  std::vector<int> out;
  for (py::handle x : parents) {
    const std::optional<PyInt> id = as_index(x);
    if (!id) refuse_non_int("begin_step: parent", x);
    out.push_back(to_int("parent", *id));
  }
  if (static_cast<int>(out.size()) != T)
    raise(kvcore::Error::InvalidArgument, "begin_step: sequence " + std::to_string(seq) + " has T = " +
                                              std::to_string(T) + " but " + std::to_string(out.size()) + " parents");
  return out;
}

// Token and parent ids the parsed entries point into.
struct EntryStorage {
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<std::vector<int>> parents;
};

// One pass over `entries` (any iterable, a generator too): each item (seq, T),
// (seq, T, tokens) or (seq, T, tokens, parents) (tokens may be None).
std::vector<kvcore::StepEntry> parse_entries(const py::handle& entries, EntryStorage* storage) {
  std::vector<kvcore::StepEntry> out;
  std::vector<std::size_t> with_tokens, with_parents;  // entries that name their tokens, their tree
  for (py::handle item : entries) {
    if (!py::isinstance<py::sequence>(item) || py::len(item) < 2 || py::len(item) > 4)
      raise(kvcore::Error::InvalidArgument,
            "begin_step: each entry is (seq, T), (seq, T, tokens) or (seq, T, tokens, parents), got " +
                py::repr(item).cast<std::string>());
    py::sequence t = py::reinterpret_borrow<py::sequence>(item);
    kvcore::StepEntry e;
    const py::object seq = t[0], T = t[1];
    const std::optional<PyInt> s = as_index(seq), n = as_index(T);
    if (!s) refuse_non_int("begin_step: seq", seq);
    if (!n) refuse_non_int("begin_step: T", T);
    e.seq = to_int("seq", *s);
    e.T = to_int("T", *n);
    if (py::len(t) >= 3 && !t[2].is_none()) {
      std::vector<std::int32_t> ids = token_ids(t[2], [](py::handle x) { refuse_non_int("begin_step: token", x); });
      if (static_cast<int>(ids.size()) != e.T)
        raise(kvcore::Error::InvalidArgument, "begin_step: sequence " + std::to_string(e.seq) + " has T = " +
                                                  std::to_string(e.T) + " but " + std::to_string(ids.size()) +
                                                  " tokens");
      with_tokens.push_back(out.size());
      storage->tokens.push_back(std::move(ids));
    }
    if (py::len(t) == 4 && !t[3].is_none()) {
      with_parents.push_back(out.size());
      storage->parents.push_back(parent_ids(t[3], e.seq, e.T));
    }
    out.push_back(e);
  }
  // Pointers only once the vectors stop moving.
  for (std::size_t k = 0; k < with_tokens.size(); ++k) out[with_tokens[k]].tokens = storage->tokens[k].data();
  for (std::size_t k = 0; k < with_parents.size(); ++k) out[with_parents[k]].parents = storage->parents[k].data();
  return out;
}

// One verify flag: a bool (numpy's too) or an int 0 or 1; nullopt otherwise.
std::optional<bool> verify_flag(const py::handle& x) {
  if (PyBool_Check(x.ptr())) return x.ptr() == Py_True;
  static const py::handle np_bool = py::object(py::module_::import("numpy").attr("bool_")).release();
  if (py::isinstance(x, np_bool)) return PyObject_IsTrue(x.ptr()) == 1;
  const std::optional<PyInt> v = as_index(x);  // an int, numpy's too: 0 or 1
  int i = 0;
  if (v && fits_int(*v, &i) && (i == 0 || i == 1)) return i == 1;
  return std::nullopt;
}

// begin_step's verify: one bool for every entry, or one per entry (any
// iterable of bools, a numpy bool array too), in entry order. Checked before
// the cache sees the step: a refusal changes nothing.
void set_verify(std::vector<kvcore::StepEntry>* entries, const py::handle& verify) {
  if (const std::optional<bool> all = verify_flag(verify)) {
    for (kvcore::StepEntry& e : *entries) e.verify = *all;
    return;
  }
  if (!py::isinstance<py::iterable>(verify) || PyUnicode_Check(verify.ptr()) || PyBytes_Check(verify.ptr()))
    raise(kvcore::Error::InvalidArgument, "begin_step: verify = " + py::repr(verify).cast<std::string>().substr(0, 40) +
                                              ": must be a bool, or one bool per entry");
  std::vector<bool> flags;
  for (py::handle x : verify) {
    if (flags.size() > entries->size()) break;  // already too many: an endless iterable ends here
    const std::optional<bool> f = verify_flag(x);
    if (!f)
      raise(kvcore::Error::InvalidArgument, "begin_step: verify[" + std::to_string(flags.size()) + "] = " +
                                                py::repr(x).cast<std::string>().substr(0, 40) + ": must be a bool");
    flags.push_back(*f);
  }
  if (flags.size() != entries->size())
    raise(kvcore::Error::InvalidArgument, "begin_step: verify has " +
                                              (flags.size() > entries->size() ? "more than " + std::to_string(entries->size())
                                                                              : std::to_string(flags.size())) +
                                              " values for " +
                                              std::to_string(entries->size()) +
                                              " entries: give one per entry, or one bool for all");
  for (std::size_t i = 0; i < flags.size(); ++i) (*entries)[i].verify = flags[i];
}

// begin_step(entries) or begin_step(seqs, T, tokens, token_offsets): the array
// form when T is given.
BatchStepHandle begin(const CachePtr& c, const py::handle& entries, const py::handle& T, const py::handle& tokens,
                      const py::handle& token_offsets, const py::handle& parents, const py::handle& verify) {
  std::vector<kvcore::StepEntry> parsed;
  EntryStorage storage;
  std::optional<IntArray> narrowed;  // the tokens the entries point into
  std::vector<int> parent_ids;
  if (!T.is_none()) {
    parsed = array_entries(*c, IntArray("begin_step", "seqs", entries), T, tokens, token_offsets, parents, &narrowed,
                           &parent_ids);
  } else {
    if (!tokens.is_none() || !token_offsets.is_none() || !parents.is_none())
      raise(kvcore::Error::InvalidArgument, "begin_step: tokens, token_offsets and parents need seqs and T as arrays");
    if (!py::isinstance<py::iterable>(entries) || PyObject_CheckBuffer(entries.ptr()) || py::hasattr(entries, "__dlpack__"))
      throw py::type_error(
          "begin_step takes entries [(seq, T), (seq, T, tokens) or (seq, T, tokens, parents), ...] or arrays "
          "(seqs, T, tokens=None, token_offsets=None, parents=None), got " +
          py::repr(entries).cast<std::string>().substr(0, 40) + " without T");
    parsed = parse_entries(entries, &storage);
  }
  set_verify(&parsed, verify);
  return BatchStepHandle{c, unwrap(c->begin_step(parsed.data(), static_cast<int>(parsed.size())))};
}

// The accepted paths of commit(step, accepted): a mapping {seq: nodes} or an
// iterable of (seq, nodes); `nodes` holds the node ids they point into.
std::vector<kvcore::AcceptedPath> accepted_paths(const py::handle& accepted, std::vector<std::vector<int>>* nodes) {
  std::vector<std::pair<py::object, py::object>> items;
  if (py::isinstance<py::dict>(accepted)) {
    for (auto kv : py::reinterpret_borrow<py::dict>(accepted))
      items.emplace_back(py::reinterpret_borrow<py::object>(kv.first), py::reinterpret_borrow<py::object>(kv.second));
  } else {
    for (py::handle item : accepted) {
      if (!py::isinstance<py::sequence>(item) || py::len(item) != 2)
        raise(kvcore::Error::InvalidArgument,
              "commit: accepted is {seq: nodes} or [(seq, nodes), ...], got the item " + py::repr(item).cast<std::string>());
      py::sequence pair = py::reinterpret_borrow<py::sequence>(item);
      items.emplace_back(pair[0], pair[1]);
    }
  }
  std::vector<kvcore::AcceptedPath> out;
  for (const auto& item : items) {
    const std::optional<PyInt> seq = as_index(item.first);
    if (!seq) refuse_non_int("commit: seq", item.first);
    std::vector<int> path;
    for (py::handle x : item.second) {
      const std::optional<PyInt> id = as_index(x);
      if (!id) refuse_non_int("commit: node", x);
      path.push_back(to_int("node", *id));
    }
    out.push_back(kvcore::AcceptedPath{to_int("seq", *seq), nullptr, static_cast<int>(path.size())});
    nodes->push_back(std::move(path));
  }
  for (std::size_t i = 0; i < out.size(); ++i) out[i].nodes = (*nodes)[i].data();
  return out;
}

// commit(step) or commit(step, accepted): the row copies per group, (n, 2)
// int32 arrays (new), or None for a plain commit.
py::object commit_batch_step(Cache& c, const BatchStepHandle& h, const py::handle& accepted) {
  if (h.cache.get() != &c) raise(kvcore::Error::InvalidState, "commit: the step belongs to another cache");
  if (accepted.is_none()) {
    throw_if_error(c.commit(h.step));
    return py::none();
  }
  std::vector<std::vector<int>> nodes;
  const std::vector<kvcore::AcceptedPath> paths = accepted_paths(accepted, &nodes);
  const kvcore::BatchCommit done = unwrap(c.commit(h.step, paths.data(), static_cast<int>(paths.size())));
  // One array per group, then one per State group (slot copies), as SequenceCache gives a State layer's.
  py::tuple out(static_cast<std::size_t>(done.n_groups + done.n_state_groups));
  for (int g = 0; g < done.n_groups; ++g)
    out[static_cast<std::size_t>(g)] = copies_array(done.groups[g].copies, done.groups[g].n_copies);
  for (int k = 0; k < done.n_state_groups; ++k)
    out[static_cast<std::size_t>(done.n_groups + k)] =
        copies_array(done.state_groups[k].copies, done.state_groups[k].n_copies);
  return std::move(out);
}

// block_table(seq, group): a copy of the sequence's table row, its committed blocks.
py::array_t<std::int32_t> block_table(const Cache& c, const IntArg& seq_arg, const IntArg& group_arg) {
  const int seq = to_int("seq", seq_arg), group = to_int("group", group_arg);
  if (seq < 0 || seq >= c.max_seqs())
    raise(kvcore::Error::InvalidArgument, "block_table: sequence " + std::to_string(seq) + " must be in [0, max_seqs = " +
                                              std::to_string(c.max_seqs()) + ")");
  if (group < 0 || group >= c.n_groups())
    raise(kvcore::Error::InvalidArgument, "block_table: group = " + std::to_string(group) + ": must be in [0, n_groups = " +
                                              std::to_string(c.n_groups()) + ")");
  const kvcore::SequenceInfo info = unwrap(c.sequence(seq));
  const std::int64_t row = c.table_rows()[seq];  // -1: inactive, no row
  const std::int64_t B = c.block_size();
  const py::ssize_t n = info.active && row >= 0 ? static_cast<py::ssize_t>((info.length + B - 1) / B) : 0;
  py::array_t<std::int32_t> out(n);
  if (n > 0) {
    const int* table = c.block_tables(group) + row * c.table_stride();
    std::int32_t* ids = out.mutable_data();
    for (py::ssize_t i = 0; i < n; ++i) ids[i] = table[i];
  }
  return out;
}

py::list holes_of(const kvcore::PositionRange* holes, int n) {
  py::list out;
  for (int i = 0; i < n; ++i) out.append(py::make_tuple(holes[i].begin, holes[i].end));
  return out;
}

}  // namespace

void register_batch(py::module_& m) {
  py::class_<SequenceSnapshot>(m, "SequenceInfo",
                               "One sequence of a BatchCache, as the runner sees it: a copy, taken when "
                               "cache.sequence(seq) was called.")
      .def_readonly("active", &SequenceSnapshot::active,
                    "False until add_sequence() or fork() (and after release_sequence()).")
      .def_readonly("length", &SequenceSnapshot::length,
                    "Committed length L: the next step writes positions L, L + 1, ...")
      .def_readonly("visible_start", &SequenceSnapshot::visible_start,
                    "Positions below it were removed (remove(seq, 0, p1)).")
      .def_property_readonly("holes",
                             [](const SequenceSnapshot& s) { return holes_of(s.holes.data(), static_cast<int>(s.holes.size())); },
                             "Removed middle ranges [(begin, end), ...], sorted.")
      .def_readonly("visible_positions", &SequenceSnapshot::visible_positions,
                    "Positions [0, length) not removed: what the sequence still sees.")
      .def("__repr__", [](const SequenceSnapshot& s) {
        return "SequenceInfo(active=" + std::string(s.active ? "True" : "False") +
               ", length=" + std::to_string(s.length) + ", visible_start=" + std::to_string(s.visible_start) +
               ", holes=" + py::repr(holes_of(s.holes.data(), static_cast<int>(s.holes.size()))).cast<std::string>() + ")";
      });

  py::class_<GroupPlanHandle>(m, "GroupPlan",
                              "One group's part of a BatchStepPlan (a group: the layers sharing a policy "
                              "and a block pool). Arrays are read-only int32 views of the cache's buffers; "
                              "reading one after the step ended raises InvalidStateError.")
      .def_readonly("group", &GroupPlanHandle::group, "The group's index.")
      .def_property_readonly(
          "slots",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(g.plan.slots, {g.n_tokens()}, py::cast(g.step.cache));
          },
          "(n_tokens,) physical row of each new token (block * block_size + offset), in token "
          "order: where to write (slot_mapping).")
      .def_property_readonly(
          "copies",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(reinterpret_cast<const int*>(g.plan.copies), {g.plan.n_copies, 2}, py::cast(g.step.cache));
          },
          "(n_copies, 2) blocks to copy, (src, dst), all block_size rows, before writing "
          "(copy-on-write of a shared, partly filled block).")
      .def_property_readonly(
          "block_tables",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(g.plan.block_tables, {g.step.cache->max_active_seqs(), g.plan.table_stride}, py::cast(g.step.cache));
          },
          "(max_active_seqs, table_stride) block of each block index, one row per active sequence, "
          "-1 for a hole; entry i reads row table_rows[seq_ids[i]] of the plan (row seq_ids[i] when "
          "max_active_seqs == max_seqs), its first ceil(context_lens[i] / block_size) entries.")
      .def_property_readonly(
          "policy",
          [](const GroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return g.plan.policy;
          },
          "The group's LayerPolicy: the window bounds of the visibility rule (a ring's window "
          "and sinks in positions; Flat: every earlier position).")
      .def("__repr__", [](const GroupPlanHandle& g) {
        return "GroupPlan(group=" + std::to_string(g.group) + ", n_tokens=" + std::to_string(g.n_tokens()) +
               ", n_copies=" + std::to_string(g.plan.n_copies) +
               (g.step.check().ok() ? ")" : ", stale: its step ended)");
      });

  py::class_<StateGroupPlanHandle>(
      m, "StateGroupPlan",
      "One State group's part of a BatchStepPlan (docs/batch.md section 10: the State layers keeping D "
      "state slots per sequence). Slots are physical state slot indices in [0, num_slots), the "
      "state_indices a recurrent kernel takes (layer l of the group keeps state i at state[l][i]), -1 "
      "for none. Arrays are read-only int32 views of the cache's buffers, one value per token of the "
      "step in token order (as GroupPlan.slots); reading one after the step ended raises "
      "InvalidStateError.")
      .def_readonly("state_group", &StateGroupPlanHandle::state_group,
                    "The State group's index (cache.state_group_of(layer)).")
      .def_property_readonly(
          "read_slots",
          [](const StateGroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(g.plan.read_slots, {g.n_tokens()}, py::cast(g.step.cache));
          },
          "(n_tokens,) the physical slot holding the state token j starts from: for an entry's first "
          "token (a tree's root) the state after position first - 1, -1 at position 0 (zeros); for a "
          "tree node its parent's write slot; for a chain token j > 0 the previous token's write slot, "
          "or -1 when the step does not keep it (the state carried within the forward).")
      .def_property_readonly(
          "write_slots",
          [](const StateGroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return view_of(g.plan.write_slots, {g.n_tokens()}, py::cast(g.step.cache));
          },
          "(n_tokens,) the physical slot where token j's state (the state after its position) is "
          "written, -1 when the step does not keep it: a chain entry without verify keeps only its "
          "last token's; a verify entry or a tree keeps every token's (tree node j in the slot of "
          "position first + chain_index[j], as a chain would). No slot one entry reads is written by "
          "another entry of the step.")
      .def_property_readonly(
          "slots_per_seq",
          [](const StateGroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return g.plan.slots_per_seq;
          },
          "D: the logical state slots each sequence keeps (the policy's slots).")
      .def_property_readonly(
          "num_slots",
          [](const StateGroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return g.plan.num_slots;
          },
          "Physical slots of the group (cache.num_state_slots): every slot named is below it.")
      .def_property_readonly(
          "policy",
          [](const StateGroupPlanHandle& g) {
            throw_if_error(g.step.check());
            return g.plan.policy;
          },
          "The group's State LayerPolicy (its slots: D).")
      .def("__repr__", [](const StateGroupPlanHandle& g) {
        return "StateGroupPlan(state_group=" + std::to_string(g.state_group) + ", n_tokens=" +
               std::to_string(g.n_tokens()) + ", slots_per_seq=" + std::to_string(g.plan.slots_per_seq) +
               (g.step.check().ok() ? ")" : ", stale: its step ended)");
      });

  py::class_<BatchPlanHandle>(m, "BatchStepPlan",
                              "The plan of a begun BatchStep in the varlen paged format. Per-entry arrays "
                              "are read-only int32 views of the cache's buffers; entry i's queries are "
                              "tokens [query_starts[i], query_starts[i+1]) at positions first_positions[i] "
                              "+ j. Reading an array after the step ended raises InvalidStateError.")
      .def_property_readonly("n_entries", [](const BatchPlanHandle& h) { return current(h).n_entries; },
                             "Sequences in the step.")
      .def_property_readonly("n_tokens", [](const BatchPlanHandle& h) { return current(h).n_tokens; },
                             "New tokens of the step, all sequences.")
      .def_property_readonly("block_size", [](const BatchPlanHandle& h) { return h.plan.block_size; },
                             "Rows per block.")
      .def_property_readonly(
          "seq_ids", [](const BatchPlanHandle& h) { return view_of(current(h).seq_ids, {h.plan.n_entries}, py::cast(h.step.cache)); },
          "(n_entries,) the sequence of each entry.")
      .def_property_readonly(
          "table_rows",
          [](const BatchPlanHandle& h) { return view_of(current(h).table_rows, {h.step.cache->max_seqs()}, py::cast(h.step.cache)); },
          "(max_seqs,) each sequence id's row in every group's block_tables: an active sequence's "
          "row (its id when max_active_seqs == max_seqs), -1 for an inactive one whatever "
          "max_active_seqs.")
      .def_property_readonly(
          "query_starts",
          [](const BatchPlanHandle& h) { return view_of(current(h).query_starts, {h.plan.n_entries + 1}, py::cast(h.step.cache)); },
          "(n_entries + 1,) entry i's tokens are [query_starts[i], query_starts[i + 1]) (cu_seqlens_q).")
      .def_property_readonly(
          "first_positions",
          [](const BatchPlanHandle& h) { return view_of(current(h).first_positions, {h.plan.n_entries}, py::cast(h.step.cache)); },
          "(n_entries,) each sequence's length before the step: its first new position.")
      .def_property_readonly(
          "context_lens",
          [](const BatchPlanHandle& h) { return view_of(current(h).context_lens, {h.plan.n_entries}, py::cast(h.step.cache)); },
          "(n_entries,) each sequence's length after the step (cache_seqlens).")
      .def_property_readonly(
          "visible_starts",
          [](const BatchPlanHandle& h) { return view_of(current(h).visible_starts, {h.plan.n_entries}, py::cast(h.step.cache)); },
          "(n_entries,) positions below it were removed from the sequence: never visible.")
      .def(
          "holes",
          [](const BatchPlanHandle& h, const IntArg& entry) {
            const kvcore::BatchStepPlan& p = current(h);
            const int i = entry_of(p, entry);
            return holes_of(p.holes[i], p.n_holes[i]);
          },
          py::arg("entry"),
          "Entry i's removed middle ranges [(begin, end), ...] of positions: never visible. "
          "InvalidArgumentError: entry outside [0, n_entries). InvalidStateError: the step ended.")
      .def(
          "arrays",
          [](const BatchPlanHandle& h) -> PlanArrays {
            const kvcore::BatchStepPlan& p = current(h);
            const py::object owner = py::cast(h.step.cache);
            PlanViewMemo& memo = PlanViewMemo::of(h.step.cache, owner);
            const int n = p.n_entries, seqs = h.step.cache->max_seqs(), rows = h.step.cache->max_active_seqs();
            constexpr int kInt = py::detail::npy_api::NPY_INT_;  // C int: int32
            bool reused = true;
            std::size_t slot = 0;
            auto one = [&](const void* data, py::ssize_t d0, py::ssize_t d1 = -1) {
              PlanViewMemo::Key key;
              key.data = data;
              key.dims[0] = d0;
              key.dims[1] = d1;
              return memo.view(slot++, key, kInt, &reused);
            };
            py::object v[6] = {one(p.seq_ids, n),         one(p.query_starts, n + 1),   one(p.first_positions, n),
                               one(p.context_lens, n),    one(p.visible_starts, n),     one(p.table_rows, seqs)};
            std::vector<py::object> per_group(static_cast<std::size_t>(3 * p.n_groups));
            for (int g = 0; g < p.n_groups; ++g) {
              const kvcore::GroupPlan& gp = p.groups[g];
              per_group[3 * g] = one(gp.slots, p.n_tokens);
              per_group[3 * g + 1] = one(gp.copies, gp.n_copies, 2);
              per_group[3 * g + 2] = one(gp.block_tables, rows, gp.table_stride);
            }
            if (reused && memo.tuple()) return py::reinterpret_borrow<PlanArrays>(memo.tuple());
            py::tuple groups(p.n_groups);
            for (int g = 0; g < p.n_groups; ++g)
              groups[g] = py::make_tuple(per_group[3 * g], per_group[3 * g + 1], per_group[3 * g + 2]);
            memo.tuple() = py::make_tuple(py::reinterpret_borrow<py::array>(v[0]), py::reinterpret_borrow<py::array>(v[1]),
                                          py::reinterpret_borrow<py::array>(v[2]), py::reinterpret_borrow<py::array>(v[3]),
                                          py::reinterpret_borrow<py::array>(v[4]), py::reinterpret_borrow<py::array>(v[5]),
                                          std::move(groups));
            return py::reinterpret_borrow<PlanArrays>(memo.tuple());
          },
          "Every array of the plan in one call, as the properties give them (the same "
          "read-only views of the cache's buffers, no copy): (seq_ids, query_starts, "
          "first_positions, context_lens, visible_starts, table_rows, groups), groups holding "
          "(slots, copies, block_tables) per group. One call instead of a property read per "
          "array: what a backend reads every step. InvalidStateError: the step ended.")
      .def_property_readonly(
          "positions", [](const BatchPlanHandle& h) { return view_of(current(h).positions, {h.plan.n_tokens}, py::cast(h.step.cache)); },
          "(n_tokens,) the position of each new token: first_positions[i] + j for a chain, "
          "first_positions[i] + depth(node) for a draft tree's node (RoPE and the mask use it).")
      .def_property_readonly(
          "chain_index",
          [](const BatchPlanHandle& h) { return view_of(current(h).chain_index, {h.plan.n_tokens}, py::cast(h.step.cache)); },
          "(n_tokens,) each token's place among its entry's reserved positions: a tree entry of N nodes "
          "takes the rows of positions [first, first + N) as a chain of N would, node j the row of "
          "position first + chain_index[j] in the block table (the main line in place). j for a chain.")
      .def_property_readonly(
          "tree_mask_starts",
          [](const BatchPlanHandle& h) { return view_of(current(h).tree_mask_starts, {h.plan.n_entries + 1}, py::cast(h.step.cache)); },
          "(n_entries + 1,) entry i's ancestor mask is tree_masks[tree_mask_starts[i]:tree_mask_starts[i + 1]] "
          "(uint32 words); an empty range: a chain (causal).")
      .def_property_readonly(
          "tree_masks",
          [](const BatchPlanHandle& h) {
            const kvcore::BatchStepPlan& p = current(h);
            return view_of(p.tree_masks, {p.tree_mask_starts[p.n_entries]}, py::cast(h.step.cache), py::detail::npy_api::NPY_UINT_);
          },
          "uint32 words of every tree entry's packed ancestor mask, entry after entry: N rows of "
          "ceil(N / 32) words, row j bit k (word k // 32, bit k % 32) set when node k is j or an ancestor "
          "of j (TensorRT-LLM's packed mask; each row's bytes are FlashInfer's packbits(bitorder='little')).")
      .def(
          "is_tree",
          [](const BatchPlanHandle& h, const IntArg& entry) {
            const kvcore::BatchStepPlan& p = current(h);
            return p.is_tree(entry_of(p, entry));
          },
          py::arg("entry"),
          "True when entry i is a draft tree (not a chain). InvalidArgumentError: entry outside "
          "[0, n_entries). InvalidStateError: the step ended.")
      .def(
          "mask",
          [](const BatchPlanHandle& h, const IntArg& group, const std::optional<PyInt>& rows) {
            const kvcore::BatchStepPlan& p = current(h);
            return plan_mask(*h.step.cache, p, to_int("group", group), rows);
          },
          py::arg("group"), py::arg("rows") = py::none(),
          "Boolean (n_tokens, rows) mask over the group's pool rows [0, rows) (default: "
          "used_blocks(group) * block_size, every live row): mask[t, r] is True when new token t "
          "may see the key in row r (its own sequence's, by the visibility rule, not removed; a tree "
          "node sees its history by the rule at its position and, of its tree, itself and its "
          "ancestors within the window). "
          "A new array. InvalidArgumentError: bad group or rows.")
      .def_property_readonly(
          "groups",
          [](const BatchPlanHandle& h) {
            const kvcore::BatchStepPlan& p = current(h);
            py::tuple out(static_cast<std::size_t>(p.n_groups));
            for (int g = 0; g < p.n_groups; ++g)
              out[static_cast<std::size_t>(g)] = GroupPlanHandle{h.step, g, p.groups[g]};
            return out;
          },
          "One GroupPlan per group (index with cache.group_of(layer)).")
      .def_property_readonly("n_state_groups", [](const BatchPlanHandle& h) { return current(h).n_state_groups; },
                             "State groups of the cache (0 without State layers).")
      .def_property_readonly(
          "state_groups",
          [](const BatchPlanHandle& h) {
            const kvcore::BatchStepPlan& p = current(h);
            py::tuple out(static_cast<std::size_t>(p.n_state_groups));
            for (int k = 0; k < p.n_state_groups; ++k)
              out[static_cast<std::size_t>(k)] = StateGroupPlanHandle{h.step, k, p.state_groups[k]};
            return out;
          },
          "One StateGroupPlan per State group (index with cache.state_group_of(layer)); empty without "
          "State layers. InvalidStateError: the step ended.")
      .def(
          "state_arrays",
          [](const BatchPlanHandle& h) {
            const kvcore::BatchStepPlan& p = current(h);
            const py::object owner = py::cast(h.step.cache);
            py::tuple out(static_cast<std::size_t>(p.n_state_groups));
            for (int k = 0; k < p.n_state_groups; ++k)
              out[static_cast<std::size_t>(k)] = py::make_tuple(view_of(p.state_groups[k].read_slots, {p.n_tokens}, owner),
                                                                view_of(p.state_groups[k].write_slots, {p.n_tokens}, owner));
            return out;
          },
          "Every State group's arrays in one call: a tuple of (read_slots, write_slots) per State group, "
          "the same read-only int32 (n_tokens,) views StateGroupPlan gives (physical state slots per "
          "token, -1 for none). Empty without State layers. InvalidStateError: the step ended.")
      .def("__repr__", [](const BatchPlanHandle& h) {
        return "BatchStepPlan(n_entries=" + std::to_string(h.plan.n_entries) + ", n_tokens=" +
               std::to_string(h.plan.n_tokens) + ", n_groups=" + std::to_string(h.plan.n_groups) +
               (h.step.check().ok() ? ")" : ", stale: its step ended)");
      });

  py::class_<BatchStepHandle>(m, "BatchStep",
                              "A begun step of a BatchCache. As a context manager it commits on normal "
                              "exit and leaves the step uncommitted when the body raises.")
      .def_property_readonly("n_entries", [](const BatchStepHandle& h) { return h.step.n_entries; },
                             "Sequences in the step.")
      .def_property_readonly("n_tokens", [](const BatchStepHandle& h) { return h.step.n_tokens; },
                             "New tokens in the step, all sequences.")
      .def_property_readonly("is_current", [](const BatchStepHandle& h) { return h.check().ok(); },
                             "True while this is the cache's begun, uncommitted step.")
      .def("plan", [](const BatchStepHandle& h) { return BatchPlanHandle{h, unwrap(h.cache->plan(h.step))}; },
           "The step's BatchStepPlan. InvalidStateError: the step is no longer the begun one.")
      .def("commit", [](const BatchStepHandle& h, const py::handle& accepted) { return commit_batch_step(*h.cache, h, accepted); },
           py::arg("accepted") = py::none(),
           "Commits the step: as cache.commit(step, accepted). InvalidStateError: stale step. "
           "InvalidArgumentError: see cache.commit.")
      .def("abort", [](const BatchStepHandle& h) { throw_if_error(h.cache->abort(h.step)); },
           "Ends the step without committing it: every length, block table and count is as "
           "before the step began (its blocks return to the pools). InvalidStateError: stale "
           "step; nothing changes.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](const BatchStepHandle& h, py::object exc_type, py::object, py::object) {
             if (exc_type.is_none()) throw_if_error(h.cache->commit(h.step));
             return false;
           })
      .def("__repr__", [](const BatchStepHandle& h) {
        return "BatchStep(n_entries=" + std::to_string(h.step.n_entries) + ", n_tokens=" + std::to_string(h.step.n_tokens) + ")";
      });

  py::class_<Cache, kvcore::CacheBase, CachePtr> cls(
      m, "BatchCache",
      "Many sequences over paged block pools (docs/design.md section 6): one pool of blocks per group "
      "of layers sharing a policy; forks share blocks, removals and rewinds release them, ring "
      "groups release what no future query can reach, and full blocks named by their token ids "
      "are reused by new sequences with the same prefix. Sequence ids are 0..max_seqs-1; every "
      "table is sized from config.batch (BatchLimits) at creation. A failing call raises and "
      "changes nothing.");
  cls.def(py::init([](const kvcore::CacheConfig& cfg) { return CachePtr(unwrap(Cache::create(cfg))); }),
           py::arg("config"),
           "Builds the cache. InvalidArgumentError names a bad config or BatchLimits field; "
           "AllocationError when its tables cannot be allocated.")
      .def_property_readonly("max_seqs", &Cache::max_seqs, "Sequence ids are 0..max_seqs-1.")
      .def_property_readonly("capacity", &Cache::capacity, "Largest length of one sequence (positions).")
      .def_property_readonly("max_step", &Cache::max_step, "Largest T of one sequence in one step.")
      .def_property_readonly("max_rewind", &Cache::max_rewind,
                             "Longest rewind, in positions, ring and chunked groups keep history for: can_rewind(s, n) "
                             "holds for n >= the longest length s committed minus this (batch.max_rewind, default max_step).")
      .def_property_readonly("max_step_tokens", &Cache::max_step_tokens, "Largest number of new tokens of one step.")
      .def_property_readonly("n_layers", &Cache::n_layers, "Number of layers (config.n_layers), in n_groups groups.")
      .def_property_readonly("n_groups", &Cache::n_groups, "Groups: layers sharing one policy and one block pool.")
      .def_property_readonly("block_size", &Cache::block_size, "Rows per block.")
      .def_property_readonly("table_stride", &Cache::table_stride, "Block table entries per row: ceil(capacity / block_size).")
      .def_property_readonly("max_active_seqs", &Cache::max_active_seqs,
                             "Sequences active at once (BatchLimits.max_active_seqs, default max_seqs): "
                             "the rows of each group's block tables.")
      .def_property_readonly("free_table_rows", &Cache::free_table_rows,
                             "Sequences that may still become active (add_sequence, fork into an inactive "
                             "one) before one is refused with CapacityError: max_active_seqs less the "
                             "active sequences (also when max_active_seqs == max_seqs).")
      .def("group_of", [](const Cache& c, const IntArg& layer) { return unwrap(c.group_of(to_int("layer", layer))); },
           py::arg("layer"),
           "The group of a layer. InvalidArgumentError: bad layer, or a State layer (it has no block "
           "group: state_group_of names its State group).")
      .def_property_readonly("n_state_groups", &Cache::n_state_groups,
                             "State groups: the State layers (recurrent state, docs/batch.md section 10) of "
                             "one policy, apart from the n_groups block groups. 0 without State layers.")
      .def("state_group_of",
           [](const Cache& c, const IntArg& layer) { return unwrap(c.state_group_of(to_int("layer", layer))); },
           py::arg("layer"),
           "The State group of a State layer, in [0, n_state_groups): index plan.state_groups and the "
           "State part of commit's copies with it. InvalidArgumentError: bad layer, or a layer that is "
           "not a State layer (the message names it; group_of names its block group).")
      .def("state_group_policy",
           [](const Cache& c, const IntArg& k) { return unwrap(c.state_group_policy(to_int("state_group", k))); },
           py::arg("state_group"),
           "The State policy of a State group's layers: its .slots is D, the logical state slots each "
           "sequence keeps (position p's state in slot p % D; a verify step needs T <= D - 1). "
           "InvalidArgumentError: state_group outside [0, n_state_groups).")
      .def("num_state_slots",
           [](const Cache& c, const IntArg& k) { return unwrap(c.num_state_slots(to_int("state_group", k))); },
           py::arg("state_group"),
           "Physical state slots of a State group (max_active_seqs * D + min(max_step_tokens, "
           "max_active_seqs * D) + batch.state_snapshots): every slot a plan or commit names is below it, and a byte layer of the "
           "group keeps this many states (state[l][slot]). InvalidArgumentError: state_group outside [0, "
           "n_state_groups).")
      .def("state_snapshots",
           [](const Cache& c, const IntArg& k) { return unwrap(c.state_snapshots(to_int("state_group", k))); },
           py::arg("state_group"),
           "Named state snapshots a State group keeps now, at most batch.state_snapshots: a committed step "
           "whose length ends a full block of known tokens names the state after it, and adopt_prefix starts "
           "a prompt with that prefix from it (docs/batch.md section 10). InvalidArgumentError: "
           "state_group outside [0, n_state_groups).")
      .def("group_policy",
           [](const Cache& c, const IntArg& group) { return unwrap(c.group_policy(to_int("group", group))); },
           py::arg("group"), "The policy of a group's layers. InvalidArgumentError: bad group.")
      .def("layer_config",
           [](const Cache& c, const IntArg& layer) { return unwrap(c.layer_config(to_int("layer", layer))); },
           py::arg("layer"), "A layer's policy and row shape. InvalidArgumentError: bad layer.")
      .def("num_blocks", [](const Cache& c, const IntArg& group) { return unwrap(c.num_blocks(to_int("group", group))); },
           py::arg("group"),
           "Blocks of the one pool every group draws from (the same for every group; a layer's rows: "
           "num_blocks * block_size). InvalidArgumentError: group outside [0, n_groups).")
      .def("used_blocks", [](const Cache& c, const IntArg& group) { return unwrap(c.used_blocks(to_int("group", group))); },
           py::arg("group"),
           "One past the highest block of the one pool any sequence holds (the same for every group): "
           "every live row lies in rows [0, used_blocks * block_size) (allocation takes the lowest free "
           "block). InvalidArgumentError: group outside [0, n_groups).")
      .def("held_blocks", [](const Cache& c, const IntArg& group) { return unwrap(c.held_blocks(to_int("group", group))); },
           py::arg("group"),
           "Blocks of the one pool the group's sequences hold now: how the budget splits between the "
           "groups (the sum over groups is num_blocks - free_blocks). InvalidArgumentError: group "
           "outside [0, n_groups).")
      .def("storage_layer", [](const Cache& c, const IntArg& layer) { return unwrap(c.storage_layer(to_int("layer", layer))); },
           py::arg("layer"),
           "The layer whose storage this layer's K/V rows may share: group g's j-th K/V layer shares with "
           "the first layer that is any group's j-th (the groups draw their blocks from one pool, so a "
           "block is one page of those layers' memory whichever group holds it); a byte layer shares when "
           "the rows have one size. Shared and State layers: themselves. InvalidArgumentError: bad layer.")
      .def("free_blocks", [](const Cache& c, const IntArg& group) { return unwrap(c.free_blocks(to_int("group", group))); },
           py::arg("group"),
           "Blocks of the one pool no sequence holds (reclaimable cached ones included; the same for every "
           "group). InvalidArgumentError: group outside [0, n_groups).")
      .def("blocks_needed",
           [](const Cache& c, const IntArg& seq, const IntArg& T) {
             std::vector<int> need(static_cast<std::size_t>(c.n_groups()));
             throw_if_error(c.blocks_needed(to_int("seq", seq), to_int("T", T), need.data()));
             return need;
           },
           py::arg("seq"), py::arg("T"),
           "The blocks a step entry of T tokens of seq takes in each group (new blocks, and private copies "
           "of blocks other sequences hold or that are named), a list of n_groups ints, as begin_step counts "
           "them: begin_step admits a step when its entries' sum over every group is at most free_blocks "
           "(plus what a begun step it replaces took), so requests admitted one by one can add their needs up "
           "and begin the step once. Changes nothing. InvalidArgumentError: seq outside [0, max_seqs), T "
           "outside [1, max_step]; InvalidStateError: seq not active; CapacityError: length + T > capacity.")
      .def("cached_blocks",
           [](const Cache& c, const IntArg& group) { return unwrap(c.cached_blocks(to_int("group", group))); },
           py::arg("group"),
           "Free blocks of the group that still hold a reusable prefix (reclaimed least recently released "
           "first, whatever their group). InvalidArgumentError: group outside [0, n_groups).")
      .def("blocks_held",
           [](const Cache& c, const IntArg& seq, const IntArg& group) {
             return unwrap(c.blocks_held(to_int("seq", seq), to_int("group", group)));
           },
           py::arg("seq"), py::arg("group"),
           "Blocks of a group the sequence holds (0 for an inactive one), shared ones included. "
           "InvalidArgumentError: seq outside [0, max_seqs) or group outside [0, n_groups).")
      .def("oldest_held",
           [](const Cache& c, const IntArg& seq, const IntArg& group) {
             return unwrap(c.oldest_held(to_int("seq", seq), to_int("group", group)));
           },
           py::arg("seq"), py::arg("group"),
           "The oldest position whose block the group still holds for the sequence (its length in "
           "positions when it holds none). InvalidArgumentError: seq outside [0, max_seqs) or group outside [0, n_groups).")
      .def("block_table", &block_table, py::arg("seq"), py::arg("group"),
           "block_table(seq, group) -> int32 (ceil(length / block_size),): the block id holding each "
           "block of the sequence's committed positions in the group's pool, by block index (block i "
           "holds positions [i * block_size, (i + 1) * block_size), its rows [id * block_size, (id + 1) "
           "* block_size) of every layer of the group); -1 for a block the group released or never kept "
           "(a ring's passed window, a removed range). A new array (a copy: later verbs do not change "
           "it); empty for an inactive sequence. Between steps it names where the rows lie; during a "
           "begun step it already names the step's copy-on-write destinations. InvalidArgumentError: seq "
           "outside [0, max_seqs) or group outside [0, n_groups).")
      .def("sequence", [](const Cache& c, const IntArg& seq) { return snapshot_of(unwrap(c.sequence(to_int("seq", seq)))); },
           py::arg("seq"), "The sequence's SequenceInfo. InvalidArgumentError: seq out of range.")
      .def("length", [](const Cache& c, const IntArg& seq) { return unwrap(c.sequence(to_int("seq", seq))).length; },
           py::arg("seq"),
           "The sequence's committed length in positions (0 for an inactive one). "
           "InvalidArgumentError: seq outside [0, max_seqs).")
      .def("add_sequence",
           [](Cache& c, const IntArg& seq, const py::handle& ns) {
             const int s = to_int("seq", seq);
             throw_if_error(c.add_sequence(s, prefix_namespace_of(ns)));
           },
           py::arg("seq"), py::arg("namespace") = py::none(),
           "Starts an empty sequence (length 0) in prefix namespace `namespace`: None (the default "
           "namespace, 0), an int in [0, 2**64), or bytes / str hashed once (BLAKE2b, 8 bytes). Its "
           "full blocks are named, and its adopt_prefix looks prompts up, in that namespace only: "
           "give requests whose K/V differ for equal tokens (a tenant, LoRA adapter, model revision, "
           "multimodal input) their own. Forks inherit it. InvalidArgumentError: seq outside [0, "
           "max_seqs), a bad namespace. InvalidStateError: it is already active. CapacityError: "
           "max_active_seqs sequences are active (no table row is free).")
      .def("prefix_namespace", [](const Cache& c, const IntArg& seq) { return unwrap(c.prefix_namespace(to_int("seq", seq))); },
           py::arg("seq"),
           "The 64-bit prefix namespace the sequence names its blocks in (0: the default; 0 once "
           "released). InvalidArgumentError: seq outside [0, max_seqs).")
      .def("release_sequence", [](Cache& c, const IntArg& seq) { throw_if_error(c.release_sequence(to_int("seq", seq))); },
           py::arg("seq"),
           "Ends a sequence and releases its blocks. InvalidArgumentError: seq outside [0, max_seqs). "
           "InvalidStateError: it is not active.")
      .def("fork",
           [](Cache& c, const IntArg& src, const IntArg& dst, const std::optional<IntArg>& upto) {
             const int s = to_int("src", src);
             const int at = upto ? to_int("upto", *upto) : (s >= 0 && s < c.max_seqs() ? unwrap(c.sequence(s)).length : 0);
             throw_if_error(c.fork(s, to_int("dst", dst), at));
           },
           py::arg("src"), py::arg("dst"), py::arg("upto") = py::none(),
           "dst inherits positions [0, upto) of src (default: all) by sharing blocks, copying no "
           "K/V. InvalidArgumentError: bad ids or upto. InvalidStateError: src not active, dst not "
           "empty, or src no longer holds what a query of dst at upto needs. CapacityError: dst is "
           "inactive and max_active_seqs sequences are active.")
      .def("remove",
           [](Cache& c, const IntArg& seq, const IntArg& p0, const std::optional<IntArg>& p1) {
             const int s = to_int("seq", seq);
             const int end = p1 ? to_int("p1", *p1) : 0x7fffffff;
             throw_if_error(c.remove(s, to_int("p0", p0), end));
           },
           py::arg("seq"), py::arg("p0"), py::arg("p1") = py::none(),
           "Positions [p0, p1) leave the sequence's history: it never sees them again; its length and "
           "positions do not change. A middle range becomes a hole, a head range moves visible_start; "
           "p0 < length <= p1 (or p1 = None) is a truncation, rewind(seq, p0); p0 >= length or p0 == p1 "
           "removes nothing: a successful no-op (llama.cpp's seq_rm), where rewind refuses p0 > length. "
           "InvalidArgumentError: seq "
           "outside [0, max_seqs), p0 < 0 or p1 < p0. InvalidStateError: seq not active, or a "
           "truncation that breaks the rewind rule (a ring group released history a query at p0 "
           "needs). CapacityError: the sequence would keep more than max_holes separate removed "
           "middle ranges.")
      .def("rewind", [](Cache& c, const IntArg& seq, const IntArg& n) { throw_if_error(c.rewind(to_int("seq", seq), to_int("n", n))); },
           py::arg("seq"), py::arg("n"),
           "length(seq) = n (positions); the sequence's blocks from index ceil(n / block_size) on are "
           "released. InvalidArgumentError: seq outside [0, max_seqs), n outside [0, length(seq)]. "
           "InvalidStateError: seq not active, or a ring group released history a query at n needs "
           "(can_rewind tells first).")
      .def("can_rewind",
           [](const Cache& c, const IntArg& seq, const IntArg& n) {
             int s = 0, v = 0;
             const PyInt seq_index = index_of("seq", seq), n_index = index_of("n", n);  // TypeError first
             return fits_int(seq_index, &s) && fits_int(n_index, &v) && c.can_rewind(s, v);
           },
           py::arg("seq"), py::arg("n"), "True exactly when rewind(seq, n) would succeed. Never raises.")
      .def("adopt_prefix",
           [](Cache& c, const IntArg& seq, const py::handle& tokens, const py::handle& ns) {
             const int s = to_int("seq", seq);
             const bool given = !ns.is_none();
             const std::uint64_t space = prefix_namespace_of(ns);
             IntArray ids("adopt_prefix", "tokens", tokens);
             // More than INT_MAX ids is more than any capacity: the cache refuses the clamped count.
             const int n = static_cast<int>(std::min<py::ssize_t>(ids.size(), INT_MAX));
             return unwrap(given ? c.adopt_prefix(s, ids.int32s(), n, space) : c.adopt_prefix(s, ids.int32s(), n));
           },
           py::arg("seq"), py::arg("tokens"), py::arg("namespace") = py::none(),
           "An empty active sequence adopts the longest cached prefix of `tokens` (a 1-D int32 or int64 "
           "array, or an ordered iterable of ints, not a set or dict; copied once) (full blocks, "
           "at most len(tokens) - 1 tokens) every group holds, in the sequence's prefix namespace; "
           "returns its length in positions, a multiple of block_size (0: a miss), which becomes the "
           "sequence's length. `namespace` (None: keep the sequence's, as add_sequence gave it) sets "
           "the namespace first (as add_sequence's). InvalidArgumentError: seq outside [0, "
           "max_seqs), len(tokens) > capacity, a bad namespace. InvalidStateError: seq not active, "
           "or not empty (length > 0).")
      .def("begin_step", &begin, py::arg("entries"), py::arg("T") = py::none(), py::arg("tokens") = py::none(),
           py::arg("token_offsets") = py::none(), py::arg("parents") = py::none(), py::kw_only(),
           py::arg("verify") = false,
           "Begins one forward; replaces an uncommitted step. Two forms:\n"
           "  begin_step(entries): entries [(seq, T), (seq, T, tokens) or (seq, T, tokens, parents), ...] "
           "(tokens: T ids, for prefix reuse, or None; parents: T ints making the tokens a draft tree of "
           "N = T nodes, parents[0] = -1 and 0 <= parents[i] < i, node i at position length + depth(i)), "
           "laid out entry after entry.\n"
           "  begin_step(seqs, T, tokens=None, token_offsets=None, parents=None): the same as arrays, with no Python "
           "object per entry: seqs the sequence of each entry; T one int for all or one per entry; "
           "tokens the step's ids flat, entry after entry (sum(T) of them), or with token_offsets "
           "(n + 1 values from 0 to len(tokens), non-decreasing) entry i's are "
           "tokens[token_offsets[i]:token_offsets[i + 1]], T[i] of them or none. Arrays: int32 or "
           "int64, 1-D, contiguous (numpy, array.array, a CPU torch tensor through DLPack) or lists "
           "of ints; int32 tokens are read in place. parents (arrays): the entries' trees flat like the "
           "tokens (by token_offsets when given: T[i] values or none, a chain; else T[i] each).\n"
           "verify (keyword, either form): True makes every entry a verify step, one that may be rewound into "
           "(speculative decoding): the State groups keep the state after each of its positions (needs T <= "
           "D - 1, D = state_group_policy(k).slots); False (the default) keeps only each entry's last. Or "
           "one bool per entry, in entry order (a list, a numpy bool array). A tree keeps every node's "
           "state anyway; models without State layers ignore it.\n"
           "T is the sequence's new tokens (positions) in this step. InvalidArgumentError: no entries "
           "or more than max_seqs, an entry not as above, seq outside [0, "
           "max_seqs), a sequence twice, T outside [1, max_step], more than max_step_tokens tokens "
           "in all, len(tokens) != T, parents not a tree in topological order (parents[0] != -1, a "
           "second root, parents[i] outside [0, i)) or not T of them; an array of another dtype, ndim "
           "or length, not contiguous, a "
           "value beyond 32 bits, token_offsets not as above; verify neither a bool nor one bool per entry "
           "(the message names the value), a verify entry with T > D - 1 of a State group. InvalidStateError: "
           "a sequence not active, or a State group no longer holds the state after length - 1 (an aborted "
           "step of T = k * D without verify: rewind first). CapacityError: length + T would pass capacity (positions), or a group's pool has "
           "fewer free blocks than the step needs. TypeError: entries neither. On any error nothing "
           "changes (a begun step stays begun).")
      .def("step", &begin, py::arg("entries"), py::arg("T") = py::none(), py::arg("tokens") = py::none(),
           py::arg("token_offsets") = py::none(), py::arg("parents") = py::none(), py::kw_only(),
           py::arg("verify") = false,
          "begin_step(...) in either form, for `with cache.step(seqs, T) as step:`; raises as begin_step.")
      .def("add_sequences", &add_sequences, py::arg("seqs"),
           "add_sequence for every id of seqs (an int32/int64 array or a list of ints), all or "
           "none: InvalidArgumentError names an id outside [0, max_seqs) or repeated, "
           "InvalidStateError one already active, CapacityError more ids than free_table_rows, and "
           "nothing changes. Empty seqs: changes nothing but ends a begun step, as every "
           "successful verb does.")
      .def("release_sequences", &release_sequences, py::arg("seqs"),
           "release_sequence for every id of seqs (an int32/int64 array or a list of ints), all or "
           "none: InvalidArgumentError names an id outside [0, max_seqs) or repeated, "
           "InvalidStateError one not active, and nothing changes. Empty seqs: changes nothing but "
           "ends a begun step, as every successful verb does.")
      .def("fork_many", &fork_many, py::arg("src"), py::arg("dsts"), py::arg("upto") = py::none(),
           "fork(src, dst, upto) for every dst of dsts (an int32/int64 array or a list of ints): "
           "each inherits positions [0, upto) of src (default: all) by sharing blocks, as for "
           "parallel sampling. All or none: InvalidArgumentError for a bad src, upto or dst id, a "
           "dst repeated or equal to src; InvalidStateError for src not active or no longer holding "
           "what a query at upto needs, or a dst not empty; CapacityError for more inactive dsts "
           "than free_table_rows; nothing changes then. Empty dsts (src and upto valid): changes "
           "nothing but ends a begun step, as every successful verb does.")
      .def("commit", &commit_batch_step, py::arg("step"), py::arg("accepted") = py::none(),
           "commit(step) commits the begun step whole (every entry's length grows by its T) and returns "
           "None. commit(step, accepted) commits draft trees: accepted maps a sequence to its accepted "
           "root path of node ids ({seq: [0, a1, ...]} or [(seq, nodes), ...]; nodes[0] = 0, each the "
           "child of the one before); its length grows by len(nodes), position length + d holding node "
           "nodes[d]. Unlisted entries must be chains and commit whole. Blocks reserved only for rejected "
           "nodes return to their pools. Returns one (n_copies, 2) int32 array per group of rows (src, "
           "dst) to copy, in order, in every layer of the group before the next step (none when a path "
           "is its tree's main line, at most len(nodes) - 1 otherwise), then one per State group "
           "(index n_groups + k: physical state slots (src, dst), the state in slot src to slot dst in "
           "every layer of State group k, in order), n_groups + n_state_groups arrays in all; afterwards "
           "the cache is as if the sequence had decoded the accepted tokens as a chain (a verify chain "
           "for the State groups: each accepted node's state in the slot its position's chain token "
           "would have written). InvalidStateError: a stale step or "
           "one of another cache. InvalidArgumentError (nothing changes): a tree entry committed "
           "without a path, a sequence not in the step or listed twice, an empty path or one longer "
           "than N, a node outside [0, N), nodes not a root path; accepted not as above.")
      .def("abort",
           [](Cache& c, const BatchStepHandle& h) {
             if (h.cache.get() != &c) raise(kvcore::Error::InvalidState, "abort: the step belongs to another cache");
             throw_if_error(c.abort(h.step));
           },
           py::arg("step"),
           "Ends the begun step without committing it (a failed forward): every length, block "
           "table and count is as before it began. InvalidStateError: a stale step or one of "
           "another cache; nothing changes.")
      .def("visible",
           [](const Cache& c, const IntArg& group, const IntArg& seq, const IntArg& q, const IntArg& k) {
             return unwrap(c.visible(to_int("group", group), to_int("seq", seq), to_int("q", q), to_int("k", k)));
           },
           py::arg("group"), py::arg("seq"), py::arg("q"), py::arg("k"),
           "May the sequence's query at position q see its key at position k on the group's layers? "
           "InvalidArgumentError: group outside [0, n_groups), seq outside [0, max_seqs), or q or k "
           "negative.")
      .def("clear", &Cache::clear, "Ends every sequence and forgets every cached block.")
      .def("__repr__", [](const Cache& c) {
        return "BatchCache(max_seqs=" + std::to_string(c.max_seqs()) + ", n_groups=" + std::to_string(c.n_groups()) +
               ", block_size=" + std::to_string(c.block_size()) + ", capacity=" + std::to_string(c.capacity()) + ")";
      });
  bind_batch_prefix(cls, m);
}

}  // namespace kvcore_py
