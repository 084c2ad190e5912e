// One source, built into several shared libraries with hidden visibility.
// Built with KVCORE_DEFINE_SHARED_REGISTRY (the runner) or
// KVCORE_SHARED_REGISTRY (the backend) they share one registry; built with
// neither (the local_* control pair) each has its own.
#include <memory>

#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/cache_registry.h"
#include "kvcore/registry/default_builders.h"
#include "kvcore/registry/registry_storage.h"
#include "kvcore/core/sequence_cache.h"

#define XLIB_API __attribute__((visibility("default")))
#define XLIB_CAT2(a, b) a##_##b
#define XLIB_CAT(a, b) XLIB_CAT2(a, b)
#define XLIB_FN(fn) XLIB_CAT(XLIB_NAME, fn)

namespace {

int g_builds = 0;

kvcore::CacheConfig flat_config(int capacity) {
  kvcore::CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.n_layers = 1;
  cfg.layers = {kvcore::LayerConfig{kvcore::LayerPolicy::flat(), 1, 4, 0}};
  return cfg;
}

kvcore::Result<std::shared_ptr<kvcore::CacheBase>> counting_builder(const kvcore::CacheConfig& cfg) {
  ++g_builds;
  return kvcore::build_sequence_cache(cfg);
}

int code(kvcore::Error e) { return static_cast<int>(e); }

}  // namespace

extern "C" {

XLIB_API int XLIB_FN(build_and_install)(const char* backend, const char* kind, const char* key,
                                        int capacity) {
  auto built = kvcore::global_builders().build(backend, kind, flat_config(capacity));
  if (!built.ok()) return code(built.error());
  return code(kvcore::global_caches().install(key, built.get()));
}

XLIB_API int XLIB_FN(install_sequence)(const char* key, int capacity) {
  kvcore::Status registered = kvcore::register_default_builders();
  if (!registered.ok()) return code(registered.code());
  return XLIB_FN(build_and_install)(kvcore::kCpuBackend, kvcore::kSequenceKind, key, capacity);
}

XLIB_API int XLIB_FN(capacity)(const char* key) {
  std::shared_ptr<kvcore::CacheBase> cache = kvcore::global_caches().get(key);
  if (cache == nullptr || cache->as_control() == nullptr) return -1;
  return cache->as_control()->capacity();
}

XLIB_API int XLIB_FN(erase)(const char* key) {
  return code(kvcore::global_caches().erase(key));
}

XLIB_API const void* XLIB_FN(registry_address)(void) { return &kvcore::global_caches(); }

XLIB_API int XLIB_FN(register_counting_builder)(const char* backend, const char* kind) {
  return code(kvcore::global_builders().register_builder(backend, kind, &counting_builder));
}

XLIB_API int XLIB_FN(builds_made)(void) { return g_builds; }

}  // extern "C"
