// Where the process-wide registries live, global_caches() and
// global_builders(): one RegistryStorage, chosen by macros, so that a process loading several shared
// libraries compiled from these headers still sees one registry.
//
//   (no macro)                      Each linked image (executable or shared
//       library) built with -fvisibility=hidden has its own storage. Right
//       for a single binary or static linking.
//   KVCORE_SHARED_REGISTRY          Every participating library is compiled
//       with it: global() calls the extern "C" accessor
//       kvcore_registry_storage_v2(), resolved by the dynamic linker.
//   KVCORE_DEFINE_SHARED_REGISTRY   Defined before including this header in
//       exactly ONE translation unit of ONE library (or the executable) in the
//       process (it implies KVCORE_SHARED_REGISTRY there): defines that
//       accessor with default visibility. The other libraries link against
//       that library (or it is loaded RTLD_GLOBAL first).
//
// Python extension modules are loaded RTLD_LOCAL and cannot link against each
// other; they reach kvcore's storage through the PyCapsule in
// kvcore/adapters/python_capsule.h instead. See docs/registry.md.
//
// The storage is built once in static memory (no allocation, so nothing can
// fail) and never destroyed: caches and builders (which may belong to
// libraries or interpreters that shut down in any order) are never destroyed
// during static destruction.
#pragma once

#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/cache_registry.h"
#include "kvcore/core/result.h"

#if defined(KVCORE_DEFINE_SHARED_REGISTRY) && !defined(KVCORE_SHARED_REGISTRY)
#define KVCORE_SHARED_REGISTRY 1
#endif

#if defined(_WIN32)
#define KVCORE_REGISTRY_EXPORT __declspec(dllexport)
#else
#define KVCORE_REGISTRY_EXPORT __attribute__((visibility("default")))
#endif

// The C++ standard library ABI: two libraries may share a storage only when
// their std::mutex and std::shared_ptr agree.
#if defined(_LIBCPP_VERSION)
#define KVCORE_REGISTRY_STDLIB_TAG "libc++"
#elif defined(__GLIBCXX__) && defined(_GLIBCXX_USE_CXX11_ABI) && _GLIBCXX_USE_CXX11_ABI
#define KVCORE_REGISTRY_STDLIB_TAG "libstdc++-cxx11"
#elif defined(__GLIBCXX__)
#define KVCORE_REGISTRY_STDLIB_TAG "libstdc++-old"
#elif defined(_MSC_VER)
#define KVCORE_REGISTRY_STDLIB_TAG "msvc"
#else
#define KVCORE_REGISTRY_STDLIB_TAG "unknown"
#endif

namespace kvcore {

/// Bumped whenever RegistryStorage, CacheRegistry, CacheBuilderRegistry or
/// CacheBase change layout or meaning.
constexpr std::uint32_t kRegistryAbiVersion = 2;
/// Identifies the standard library ABI the storage was compiled against.
constexpr const char* kRegistryAbiTag = KVCORE_REGISTRY_STDLIB_TAG;

/// The process-wide registries. Its first three fields let a library built
/// elsewhere check it may use the object before touching the rest.
struct RegistryStorage {
  std::uint32_t abi_version = kRegistryAbiVersion;
  std::uint32_t size = static_cast<std::uint32_t>(sizeof(RegistryStorage));
  const char* abi_tag = kRegistryAbiTag;
  CacheRegistry caches;
  CacheBuilderRegistry builders;
};

/// Ok when `storage` was built by code compatible with this one.
/// InvalidArgument: null. NotSupported: another ABI version, size or stdlib.
inline Status check_registry_storage(const RegistryStorage* storage) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(storage != nullptr, InvalidArgument, "registry storage is null");
  KVCORE_CHECK_OR_RETURN_ERROR(
      storage->abi_version == kRegistryAbiVersion, NotSupported,
      "registry storage has ABI version %u, this code needs %u: rebuild against the same kvcore",
      static_cast<unsigned>(storage->abi_version), static_cast<unsigned>(kRegistryAbiVersion));
  KVCORE_CHECK_OR_RETURN_ERROR(
      storage->size == sizeof(RegistryStorage), NotSupported,
      "registry storage is %u bytes, this code expects %u: rebuild against the same kvcore",
      static_cast<unsigned>(storage->size), static_cast<unsigned>(sizeof(RegistryStorage)));
  KVCORE_CHECK_OR_RETURN_ERROR(
      storage->abi_tag != nullptr && std::strcmp(storage->abi_tag, kRegistryAbiTag) == 0,
      NotSupported, "registry storage uses the %s standard library ABI, this code uses %s",
      storage->abi_tag != nullptr ? storage->abi_tag : "(null)", kRegistryAbiTag);
  return Error::Ok;
}

namespace internal {
// Built on first use in static memory and never destroyed (see the top).
inline RegistryStorage* make_registry_storage() noexcept {
  alignas(RegistryStorage) static unsigned char memory[sizeof(RegistryStorage)];
  return new (memory) RegistryStorage();
}
}  // namespace internal

}  // namespace kvcore

#if defined(KVCORE_SHARED_REGISTRY)
/// The one storage of the process. Defined (with default visibility) by the
/// translation unit that defines KVCORE_DEFINE_SHARED_REGISTRY.
extern "C" KVCORE_REGISTRY_EXPORT kvcore::RegistryStorage* kvcore_registry_storage_v2() noexcept;
#endif

namespace kvcore {

/// The storage behind global(); see the top of this file for which one.
/// Aborts with a message when a shared storage fails check_registry_storage().
inline RegistryStorage& registry_storage() noexcept {
#if defined(KVCORE_SHARED_REGISTRY)
  static RegistryStorage* const storage = [] {
    RegistryStorage* s = kvcore_registry_storage_v2();
    const Status status = check_registry_storage(s);
    KVCORE_CHECK(status.ok(), status.message().c_str());
    return s;
  }();
#else
  static RegistryStorage* const storage = internal::make_registry_storage();
#endif
  return *storage;
}

/// The process-wide cache registry. Which storage backs it (one per library,
/// or one per process across libraries) is chosen at the top of this file.
inline CacheRegistry& global_caches() noexcept { return registry_storage().caches; }
/// The process-wide builder registry (same storage as global_caches()).
inline CacheBuilderRegistry& global_builders() noexcept { return registry_storage().builders; }

}  // namespace kvcore

#if defined(KVCORE_DEFINE_SHARED_REGISTRY)
extern "C" KVCORE_REGISTRY_EXPORT kvcore::RegistryStorage* kvcore_registry_storage_v2() noexcept {
  static kvcore::RegistryStorage* const storage = kvcore::internal::make_registry_storage();
  return storage;
}
#endif
