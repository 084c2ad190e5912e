// KVPool's state slots: the named state tensors of each State layer.
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

void bind_kv_pool_states(py::class_<PyPool>& cls) {
  cls
      .def("state_names",
           [](const PyPool& p, const PyInt& layer) { return p.states().checked_names(p.pool(), p.checked_layer(layer)); },
           py::arg("layer"),
           "The names of State layer `layer`'s state tensors, in the order state_tensors gave them. "
           "InvalidArgumentError: bad layer, a layer that is not a State layer.")
      .def("write_state",
           [](PyPool& p, const PyInt& layer, const StepHandle& step, py::handle states) {
             const int l = p.checked_layer(layer);
             p.write_state(l, checked_step(p, step), states);
           },
           py::arg("layer"), py::arg("step"), py::arg("states"),
           "Stores the states the begun `step` produces on State layer `layer`: states[name] is an "
           "array (n, *shape) of the tensor's dtype, C-contiguous, for every tensor of the layer, row j "
           "the state after the j-th position the step keeps: n = step.plan(layer).write_len, T for a "
           "verify step (begin_step(T, verify=True)), 1 (the last position's) for any other chain step, "
           "N for a tree step (row i: node i's). Every name, shape and dtype is checked before anything "
           "is written. InvalidArgumentError: bad layer, not a State layer, a missing or unknown name, "
           "another shape or dtype, not C-contiguous; InvalidStateError: `step` is stale or of another cache.")
      .def("read_state",
           [](PyPool& p, const PyInt& layer, const StepHandle& step, py::handle node) {
             const int l = p.checked_layer(layer);
             return p.read_state(l, checked_step(p, step), node);
           },
           py::arg("layer"), py::arg("step"), py::kw_only(), py::arg("node") = py::none(),
           "The state the begun `step` starts from on State layer `layer`, as a dict name -> read-only "
           "array of the tensor's shape (a copy): the state after position P - 1, zeros at P = 0. "
           "Read it before write_state (a step without verify may write its last state into that slot). "
           "node=i (a tree step): the state tree node i starts from, its parent's (write_state the "
           "tree first), the root's being the step's. InvalidArgumentError: bad layer, not a State "
           "layer, node outside [0, N) or given for a chain step; InvalidStateError: `step` is stale "
           "or of another cache.")
      .def("state_slots",
           [](const PyPool& p, const PyInt& layer, const std::string& name) {
             return p.state_slots(p.checked_layer(layer), name);
           },
           py::arg("layer"), py::arg("name"),
           "Read-only zero-copy array (D, *shape) of tensor `name` in every slot of State layer `layer` "
           "(D = rows(layer)), for kernels that index slots themselves (vLLM-style state_indices: "
           "step.plan(layer).read names the slot a step starts from, its write runs the slots it fills). "
           "InvalidArgumentError: bad layer, not a State layer, no such tensor.");
}

}  // namespace kvcore_py
