// BatchCache's prefix lookups and KV events at the Python boundary
// (batch_prefix.cpp): what a scheduler asks before it admits and what a
// router or a lower tier drains.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "kvcore/batch/batch_cache.h"

namespace kvcore_py {

namespace py = pybind11;

/// Adds lookup_prefix, the KV event verbs and their properties to BatchCache,
/// and the module's block_keys and KV_EVENT_* constants.
void bind_batch_prefix(py::class_<kvcore::BatchCache, kvcore::CacheBase, std::shared_ptr<kvcore::BatchCache>>& cls,
                       py::module_& m);

}  // namespace kvcore_py
