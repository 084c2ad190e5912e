// A BatchCache step's entries and commit at the Python boundary: begin_step's
// two forms (entries or arrays) and verify flags, and commit's accepted paths.
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
#include "batch_arrays.h"
#include "batch_bindings.h"
#include "batch_step_handle.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"
#include "tree_binding.h"

namespace kvcore_py {

namespace {

using Cache = kvcore::BatchCache;
using CachePtr = std::shared_ptr<Cache>;

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

}  // namespace

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

// begin_step(entries) or begin_step(seqs, T, tokens, token_offsets): the array
// form when T is given.
BatchStepHandle begin_batch_step(const CachePtr& c, const py::handle& entries, const py::handle& T,
                                 const py::handle& tokens, const py::handle& token_offsets, const py::handle& parents,
                                 const py::handle& verify) {
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

// commit(step) or commit(step, accepted): the row copies per group, (n, 2)
// int32 arrays (new), or None for a plain commit.
py::object commit_batch_step(kvcore::BatchCache& c, const BatchStepHandle& h, const py::handle& accepted) {
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

}  // namespace kvcore_py
