// BatchCache verbs over arrays: see batch_arrays.h.
#include "batch_arrays.h"

#include <cstdint>
#include <string>
#include <vector>

#include "errors.h"

namespace kvcore_py {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

// T: one int for every entry, or one per entry (an IntArray of n values).
struct StepLengths {
  std::optional<IntArray> per_entry;
  int all = 0;

  StepLengths(py::handle T, py::ssize_t n) {
    if (PyLong_Check(T.ptr())) {
      all = to_int("T", IntArg{py::reinterpret_borrow<py::object>(T)});
      return;
    }
    per_entry.emplace("begin_step", "T", T, /*allow_scalar=*/true);
    if (per_entry->is_scalar()) {
      all = per_entry->at(0);
      per_entry.reset();
    } else if (per_entry->size() != n) {
      raise(kvcore::Error::InvalidArgument, "begin_step: T has " + str(per_entry->size()) + " values for " +
                                                str(n) + " sequences: give one per sequence, or one int for all");
    }
  }
  int operator()(py::ssize_t i) const { return per_entry ? per_entry->at(i) : all; }
};

// Entry i's tokens are ids[offsets[i], offsets[i + 1]): T[i] of them, or none.
void attach_by_offsets(std::vector<kvcore::StepEntry>* entries, const std::int32_t* ids, py::ssize_t n_ids,
                       const IntArray& offsets) {
  const py::ssize_t n = static_cast<py::ssize_t>(entries->size());
  if (offsets.size() != n + 1)
    raise(kvcore::Error::InvalidArgument, "begin_step: token_offsets has " + str(offsets.size()) + " values for " +
                                              str(n) + " sequences: must have n + 1 = " + str(n + 1));
  if (offsets[0] != 0)
    raise(kvcore::Error::InvalidArgument, "begin_step: token_offsets[0] = " + str(offsets[0]) + ": must be 0");
  if (offsets[n] != n_ids)
    raise(kvcore::Error::InvalidArgument, "begin_step: token_offsets[" + str(n) + "] = " + str(offsets[n]) +
                                              ": must be len(tokens) = " + str(n_ids));
  for (py::ssize_t i = 0; i < n; ++i) {
    const std::int64_t from = offsets[i], to = offsets[i + 1];
    if (to < from)
      raise(kvcore::Error::InvalidArgument, "begin_step: token_offsets[" + str(i + 1) + "] = " + str(to) +
                                                " < token_offsets[" + str(i) + "] = " + str(from) +
                                                ": must not decrease");
    kvcore::StepEntry& e = (*entries)[static_cast<std::size_t>(i)];
    if (to - from != 0 && to - from != e.T)
      raise(kvcore::Error::InvalidArgument, "begin_step: sequence " + str(e.seq) + " has T = " + str(e.T) +
                                                " but token_offsets gives it " + str(to - from) +
                                                " tokens: must be T or 0 (none)");
    if (to > from) e.tokens = ids + from;
  }
}

// Entry i's tokens follow entry i - 1's: T[i] of them each.
void attach_in_order(std::vector<kvcore::StepEntry>* entries, const std::int32_t* ids, py::ssize_t n_ids) {
  std::int64_t total = 0;
  for (const kvcore::StepEntry& e : *entries) total += e.T;
  if (total != n_ids)
    raise(kvcore::Error::InvalidArgument, "begin_step: tokens has " + str(n_ids) + " ids, the entries' T add up to " +
                                              str(total) + " (token_offsets can give entries none)");
  std::int64_t at = 0;
  for (kvcore::StepEntry& e : *entries) {
    if (e.T < 1) return;  // the cache refuses it: no pointer past the ids
    e.tokens = ids + at;
    at += e.T;
  }
}

// Sequence ids of a many-sequence verb: each in [0, max_seqs), none twice.
std::vector<int> distinct_seqs(const kvcore::BatchCache& c, const char* verb, const IntArray& ids) {
  std::vector<int> out(static_cast<std::size_t>(ids.size()));
  std::vector<bool> seen(static_cast<std::size_t>(c.max_seqs()));
  for (py::ssize_t i = 0; i < ids.size(); ++i) {
    const int s = ids.at(i);
    if (s < 0 || s >= c.max_seqs())
      raise(kvcore::Error::InvalidArgument, std::string(verb) + ": " + ids.name() + "[" + str(i) + "] = " +
                                                str(s) + ": must be in [0, max_seqs = " + str(c.max_seqs()) + ")");
    if (seen[static_cast<std::size_t>(s)])
      raise(kvcore::Error::InvalidArgument, std::string(verb) + ": sequence " + str(s) + " appears twice in " +
                                                ids.name());
    seen[static_cast<std::size_t>(s)] = true;
    out[static_cast<std::size_t>(i)] = s;
  }
  return out;
}

bool is_active(const kvcore::BatchCache& c, int seq) { return unwrap(c.sequence(seq)).active; }

// CapacityError unless `n` more sequences can become active (a table row each).
void check_rows(const kvcore::BatchCache& c, const char* verb, int n) {
  if (n > c.free_table_rows())
    raise(kvcore::Error::OutOfResources, std::string(verb) + ": " + str(n) + " sequences would become active, " +
                                             str(c.free_table_rows()) + " table rows are free (batch.max_active_seqs = " +
                                             str(c.max_active_seqs()) + ")");
}

// Entry i's parents: parents[offsets[i], offsets[i + 1]) with the tokens'
// offsets (T[i] of them, or none: a chain), else T[i] each in entry order.
void attach_parents(std::vector<kvcore::StepEntry>* entries, py::handle parents, const IntArray* token_offsets,
                    std::vector<int>* storage) {
  const IntArray ids("begin_step", "parents", parents);
  *storage = ids.ints();
  const py::ssize_t n = static_cast<py::ssize_t>(entries->size());
  if (token_offsets == nullptr) {
    std::int64_t total = 0;
    for (const kvcore::StepEntry& e : *entries) total += e.T;
    if (total != ids.size())
      raise(kvcore::Error::InvalidArgument, "begin_step: parents has " + str(ids.size()) +
                                                " values, the entries' T add up to " + str(total) +
                                                " (token_offsets can give entries none)");
    std::int64_t at = 0;
    for (kvcore::StepEntry& e : *entries) {
      if (e.T < 1) return;  // the cache refuses it
      e.parents = storage->data() + at;
      at += e.T;
    }
    return;
  }
  const IntArray& offsets = *token_offsets;  // checked with the tokens
  if (offsets[n] != ids.size())
    raise(kvcore::Error::InvalidArgument, "begin_step: token_offsets[" + str(n) + "] = " + str(offsets[n]) +
                                              ": must be len(parents) = " + str(ids.size()));
  for (py::ssize_t i = 0; i < n; ++i)
    if (offsets[i + 1] > offsets[i]) (*entries)[static_cast<std::size_t>(i)].parents = storage->data() + offsets[i];
}

}  // namespace

std::vector<kvcore::StepEntry> array_entries(const kvcore::BatchCache& c, const IntArray& seqs, py::handle T,
                                             py::handle tokens, py::handle token_offsets, py::handle parents,
                                             std::optional<IntArray>* token_ids, std::vector<int>* parent_ids) {
  // Each array is read (copied) once, here: what is checked below is what the entries point into.
  std::optional<IntArray> offsets;
  if (!token_offsets.is_none()) {
    if (tokens.is_none()) raise(kvcore::Error::InvalidArgument, "begin_step: token_offsets given without tokens");
    offsets.emplace("begin_step", "token_offsets", token_offsets);
  }
  std::vector<kvcore::StepEntry> out = array_tokens(c, seqs, T, tokens, offsets ? &*offsets : nullptr, token_ids);
  if (!parents.is_none()) attach_parents(&out, parents, offsets ? &*offsets : nullptr, parent_ids);
  return out;
}

std::vector<kvcore::StepEntry> array_tokens(const kvcore::BatchCache& c, const IntArray& seqs, py::handle T,
                                            py::handle tokens, const IntArray* token_offsets,
                                            std::optional<IntArray>* token_ids) {
  const py::ssize_t n = seqs.size();
  if (n < 1 || n > c.max_seqs())
    raise(kvcore::Error::InvalidArgument, "begin_step: " + str(n) + " entries, must be in [1, max_seqs = " +
                                              str(c.max_seqs()) + "]");
  const StepLengths lengths(T, n);
  std::vector<kvcore::StepEntry> out(static_cast<std::size_t>(n));
  for (py::ssize_t i = 0; i < n; ++i) {
    const std::int64_t seq = seqs[i];  // at(i) only to name one that does not fit (at() is out of line)
    const int id = seq >= INT32_MIN && seq <= INT32_MAX ? static_cast<int>(seq) : seqs.at(i);
    out[static_cast<std::size_t>(i)] = kvcore::StepEntry{id, lengths(i), nullptr};
  }
  if (tokens.is_none()) return out;
  IntArray& ids = token_ids->emplace("begin_step", "tokens", tokens);
  const std::int32_t* data = ids.int32s();
  const py::ssize_t n_ids = ids.size();
  if (token_offsets == nullptr)
    attach_in_order(&out, data, n_ids);
  else
    attach_by_offsets(&out, data, n_ids, *token_offsets);
  return out;
}

// An array verb given no ids succeeds, and every successful verb ends a begun
// step (docs/batch.md section 3). A step's entries are active sequences, and a
// removal from an active sequence's length on is the core's verb that changes
// nothing but the begun step.
void end_begun_step(kvcore::BatchCache& c) {
  if (!c.has_begun_step()) return;
  for (int s = 0; s < c.max_seqs(); ++s) {
    const kvcore::SequenceInfo info = unwrap(c.sequence(s));
    if (info.active) return throw_if_error(c.remove(s, info.length, info.length));
  }
}

void add_sequences(kvcore::BatchCache& c, py::handle seqs) {
  const std::vector<int> ids = distinct_seqs(c, "add_sequences", IntArray("add_sequences", "seqs", seqs));
  for (int s : ids)
    if (is_active(c, s)) raise(kvcore::Error::InvalidState, "add_sequences: sequence " + str(s) + " is already active");
  check_rows(c, "add_sequences", static_cast<int>(ids.size()));
  if (ids.empty()) end_begun_step(c);
  for (int s : ids) throw_if_error(c.add_sequence(s));  // checked above: cannot fail
}

void release_sequences(kvcore::BatchCache& c, py::handle seqs) {
  const std::vector<int> ids = distinct_seqs(c, "release_sequences", IntArray("release_sequences", "seqs", seqs));
  for (int s : ids)
    if (!is_active(c, s))
      raise(kvcore::Error::InvalidState, "release_sequences: sequence " + str(s) + " is not active");
  if (ids.empty()) end_begun_step(c);
  for (int s : ids) throw_if_error(c.release_sequence(s));
}

void fork_many(kvcore::BatchCache& c, const IntArg& src, py::handle dsts, const std::optional<IntArg>& upto) {
  const int s = to_int("src", src);
  if (s < 0 || s >= c.max_seqs())
    raise(kvcore::Error::InvalidArgument,
          "fork_many: src = " + str(s) + ": must be in [0, max_seqs = " + str(c.max_seqs()) + ")");
  if (!is_active(c, s))
    raise(kvcore::Error::InvalidState, "fork_many: src = " + str(s) + " is not active (add_sequence or fork it first)");
  const int length = unwrap(c.sequence(s)).length;
  const int at = upto ? to_int("upto", *upto) : length;
  if (at < 0 || at > length)
    raise(kvcore::Error::InvalidArgument,
          "fork_many: upto = " + str(at) + ": must be in [0, length = " + str(length) + "] of src " + str(s));
  if (!c.can_rewind(s, at))
    raise(kvcore::Error::InvalidState, "fork_many: src " + str(s) + " no longer holds what a query at " + str(at) +
                                           " needs (a ring group released it)");
  const IntArray targets("fork_many", "dsts", dsts);
  const std::vector<int> ids = distinct_seqs(c, "fork_many", targets);
  int becoming = 0;  // dsts made active: each takes a table row
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int d = ids[i];
    if (d == s)
      raise(kvcore::Error::InvalidArgument, "fork_many: dsts[" + str(static_cast<std::int64_t>(i)) + "] = " + str(d) +
                                                " is src: a sequence cannot fork into itself");
    const kvcore::SequenceInfo info = unwrap(c.sequence(d));
    if (info.active && info.length > 0)
      raise(kvcore::Error::InvalidState,
            "fork_many: dst " + str(d) + " holds " + str(info.length) + " positions; it must be empty");
    becoming += info.active ? 0 : 1;
  }
  check_rows(c, "fork_many", becoming);
  // Paged tables: every fork takes src's pages, each dst gives its own back first.
  const std::int64_t need = static_cast<std::int64_t>(ids.size()) * c.fork_table_pages(s, at);
  std::int64_t free = c.free_table_pages();
  for (int d : ids) free += c.table_pages_held(d);
  if (need > free)
    raise(kvcore::Error::OutOfResources, "fork_many: " + str(static_cast<std::int64_t>(ids.size())) +
                                             " forks need up to " + str(need) + " table pages, " + str(free) +
                                             " of batch.table_pages = " + str(c.table_pages()) + " are free");
  if (ids.empty()) end_begun_step(c);
  for (int d : ids) throw_if_error(c.fork(s, d, at));  // checked above: cannot fail
}

}  // namespace kvcore_py
