// How pybind11 finds the Python type of a CacheBase it returns. Its default
// asks typeid(*cache), which crashes on a cache made by code compiled with
// -fno-rtti (the usual build of an embedded runner or backend): such a cache's
// vtable has no type_info. Those caches reach Python as kvcore.CacheBase;
// every other cache as its registered Python type (e.g. SequenceCache).
#pragma once

#include <pybind11/pybind11.h>

#include <typeinfo>

#include "kvcore/core/cache_base.h"

namespace kvcore_py {

/// True when the dynamic type of `cache` carries RTTI, so typeid is safe.
inline bool has_type_info(const kvcore::CacheBase* cache) noexcept {
#if defined(__GXX_ABI_VERSION)
  // Itanium C++ ABI: the slot before a vtable's first function holds the
  // type_info pointer; -fno-rtti code leaves it null.
  const void* const* vtable = *reinterpret_cast<const void* const* const*>(cache);
  return vtable[-1] != nullptr;
#else
  (void)cache;
  return false;  // no portable check: never downcast
#endif
}

}  // namespace kvcore_py

namespace pybind11 {
template <>
struct polymorphic_type_hook<kvcore::CacheBase> {
  static const void* get(const kvcore::CacheBase* src, const std::type_info*& type) {
    type = nullptr;
    if (src == nullptr || !kvcore_py::has_type_info(src)) return src;
    type = &typeid(*src);
    return dynamic_cast<const void*>(src);
  }
};
}  // namespace pybind11
