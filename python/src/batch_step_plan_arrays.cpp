// BatchStepPlan.arrays(): every array of a plan in one call, the views kept per cache.
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

#include "bindings.h"
#include "batch_plan_handles.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

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

}  // namespace

PlanArrays plan_arrays(const BatchPlanHandle& h) {
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
    // Paged tables have no dense view: None (GroupPlan.entry_tables reads them).
    per_group[3 * g + 2] = gp.block_tables != nullptr ? one(gp.block_tables, rows, gp.table_stride) : py::none();
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
}

}  // namespace kvcore_py
