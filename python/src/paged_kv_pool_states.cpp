// PagedKVPool's state slots: the named state tensors of each State layer, per physical slot.
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

void bind_paged_kv_pool_states(py::class_<PyPagedPool>& cls) {
  cls
      .def(
          "state_names",
          [](const PyPagedPool& p, const PyInt& layer) { return p.states().checked_names(p.pool(), p.checked_layer(layer)); },
          py::arg("layer"),
          "The names of State layer `layer`'s state tensors, in the order state_tensors gave them. "
          "InvalidArgumentError: bad layer, a layer that is not a State layer.")
      .def(
          "write_state",
          [](PyPagedPool& p, const PyInt& layer, const BatchStepHandle& step, py::handle states, py::handle entry) {
            const int l = p.checked_layer(layer);
            p.write_state(l, p.plan_of(step), states, entry);
          },
          py::arg("layer"), py::arg("step"), py::arg("states"), py::kw_only(), py::arg("entry") = py::none(),
          "write_state(layer, step, states, *, entry=None): stores the states the begun `step` keeps on "
          "State layer `layer`, for every token of the step (or of entry `entry` only): states[name] is an "
          "array (n, *shape) of the tensor's dtype, C-contiguous, for every tensor of the layer, row i the "
          "state after the position of the i-th token whose write slot is set (plan.state_groups[k]"
          ".write_slots >= 0, k = cache.state_group_of(layer)), in token order: every token of a verify "
          "step or a tree, the last of each other entry. Each goes to its physical slot. Every name, shape "
          "and dtype is checked before anything is written. InvalidArgumentError: bad layer, not a State "
          "layer, a bad entry, a missing or unknown name, another shape or dtype, not C-contiguous; "
          "InvalidStateError: a stale step or another cache's.")
      .def(
          "read_state",
          [](PyPagedPool& p, const PyInt& layer, const BatchStepHandle& step, const PyInt& token) {
            const int l = p.checked_layer(layer);
            return p.read_state(l, p.plan_of(step), to_int("token", token));
          },
          py::arg("layer"), py::arg("step"), py::arg("token"),
          "read_state(layer, step, token) -> dict: the state token `token` of the begun `step` starts from "
          "on State layer `layer`, as name -> read-only array of the tensor's shape (a copy): the slot "
          "plan.state_groups[k].read_slots[token] names (the state after position - 1: an entry's first "
          "token's, a tree node's parent's, a verify step's previous token's), zeros at position 0. Read an "
          "entry's first token before write_state (an entry may write the slot it reads). "
          "InvalidArgumentError: bad layer, not a State layer, token outside [0, n_tokens), a token past "
          "position 0 that reads no slot (its state is carried within the forward: a step without verify "
          "keeps only its last); InvalidStateError: a stale step or another cache's.")
      .def(
          "state_slots",
          [](const PyPagedPool& p, const PyInt& layer, const std::string& name) {
            return p.state_slots(p.checked_layer(layer), name);
          },
          py::arg("layer"), py::arg("name"),
          "Read-only zero-copy array (num_slots, *shape) of tensor `name` in every physical slot of State "
          "layer `layer` (num_slots = cache.num_state_slots(cache.state_group_of(layer))), for kernels that "
          "index slots themselves (vLLM / SGLang state_indices: plan.state_groups[k].read_slots and "
          "write_slots per token). The view keeps the storage alive. InvalidArgumentError: bad layer, not a "
          "State layer, no such tensor.");
}

}  // namespace kvcore_py
