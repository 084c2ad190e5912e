// What a BatchStepPlan hands Python (batch_step_plan.cpp, group_plan.cpp,
// state_group_plan.cpp): the plan and its per-group parts, each with the step
// it was made for, and the read-only numpy views of the cache's buffers they give.
#pragma once

#include <pybind11/numpy.h>

#include <initializer_list>
#include <memory>
#include <string>

#include "batch_step_handle.h"
#include "errors.h"
#include "int_args.h"
#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace py = pybind11;

// A read-only int32 view of the ints at `data` (C order, shape `shape`: one
// or two sizes), kept alive by `owner`. Made through numpy's C API: a plan's
// arrays are read every step, and pybind11's array constructor costs twice this.
inline py::array view_of(const void* data, std::initializer_list<py::ssize_t> shape, py::handle owner,
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

inline const kvcore::BatchStepPlan& current(const BatchPlanHandle& h) {
  throw_if_error(h.step.check());  // a plan of an ended step is stale
  return h.plan;
}

// An entry index of the plan: InvalidArgumentError outside [0, n_entries).
inline int entry_of(const kvcore::BatchStepPlan& p, const IntArg& entry) {
  const int i = to_int("entry", entry);
  if (i < 0 || i >= p.n_entries)
    raise(kvcore::Error::InvalidArgument,
          "entry = " + std::to_string(i) + ": must be >= 0 and < n_entries = " + std::to_string(p.n_entries));
  return i;
}

/// plan.arrays(): every array of the plan, the views memoized per cache (batch_step_plan_arrays.cpp).
PlanArrays plan_arrays(const BatchPlanHandle& h);

}  // namespace kvcore_py
