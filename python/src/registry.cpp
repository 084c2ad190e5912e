// Python view of the process-wide registries: caches by key, builders by
// (backend, kind) (Python callables allowed), and the PyCapsule through which
// other extension modules reach the very same storage.
//
// This translation unit defines the storage (the whole module is compiled
// with KVCORE_SHARED_REGISTRY). Its accessor has default visibility, so a host
// program that already defines one (linked or loaded RTLD_GLOBAL before
// Python imports kvcore) wins and Python shares the host's registries.
#define KVCORE_DEFINE_SHARED_REGISTRY 1

#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "kvcore/registry/cache_builder_registry.h"
#include "kvcore/registry/cache_registry.h"
#include "kvcore/registry/default_builders.h"
#include "kvcore/adapters/python_capsule.h"
#include "kvcore/registry/registry_storage.h"

namespace kvcore_py {

namespace {

// The interpreter cannot run Python code (or release references) any more.
bool interpreter_gone() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

// When Python code calls kvcore.build(), a Python builder that raises hands
// its exception to that call, which re-raises it unchanged. Frames nest: a
// builder may call kvcore.build() itself. C++ callers get only the Status.
struct PythonBuildFrame;
thread_local PythonBuildFrame* t_build_frame = nullptr;
struct PythonBuildFrame {
  PythonBuildFrame() : outer(t_build_frame) { t_build_frame = this; }
  ~PythonBuildFrame() { t_build_frame = outer; }
  PythonBuildFrame(const PythonBuildFrame&) = delete;
  PythonBuildFrame& operator=(const PythonBuildFrame&) = delete;
  py::object raised;
  PythonBuildFrame* outer;
};

struct BuilderNames {
  std::string backend_id;
  std::string kind;
};

struct PythonBuilder {
  BuilderNames names;
  py::object fn;
};

// Runs a Python builder for CacheBuilderRegistry::build(), from any thread:
// takes the GIL itself (the registry lock is not held here).
kvcore::Result<std::shared_ptr<kvcore::CacheBase>> call_python_builder(
    void* state, const kvcore::CacheConfig& cfg) {
  if (interpreter_gone())
    return kvcore::Status::make(kvcore::Error::InvalidState,
                                "a Python builder cannot run: the interpreter has shut down");
  py::gil_scoped_acquire gil;
  const PythonBuilder& builder = *static_cast<const PythonBuilder*>(state);
  try {
    py::object made = builder.fn(cfg);  // the config is copied into Python
    const BuilderNames& n = builder.names;
    if (made.is_none())
      return kvcore::Status::make(kvcore::Error::Internal,
                                  "builder ('%s', '%s') returned None, not a kvcore cache",
                                  n.backend_id, n.kind);
    if (!py::isinstance<kvcore::CacheBase>(made)) {
      const std::string type = py::str(py::type::of(made).attr("__name__"));
      return kvcore::Status::make(kvcore::Error::Internal,
                                  "builder ('%s', '%s') returned a %s, not a kvcore cache",
                                  n.backend_id, n.kind, type);
    }
    return made.cast<std::shared_ptr<kvcore::CacheBase>>();
  } catch (py::error_already_set& e) {
    kvcore::Error code = kvcore::Error::Internal;
    py::object kv_error = py::module_::import("kvcore._errors").attr("KVCacheError");
    if (py::isinstance(e.value(), kv_error))
      code = static_cast<kvcore::Error>(e.value().attr("code").cast<std::uint32_t>());
    const std::string type = py::str(e.type().attr("__name__"));
    const std::string text = py::str(e.value());
    if (t_build_frame != nullptr && !t_build_frame->raised) t_build_frame->raised = e.value();
    // The caller of build() knows which builder it named: the message's room
    // goes to the exception (a Python caller gets the exception itself).
    return kvcore::Status::make(code, "the Python builder raised %s: %s", type, text);
  } catch (const std::exception& e) {  // never let an exception reach the C++ caller
    return kvcore::Status::make(kvcore::Error::Internal, "builder ('%s', '%s') failed: %s",
                                builder.names.backend_id, builder.names.kind, e.what());
  }
}

// Owns a PythonBuilder; releases its Python references under the GIL (or
// leaks them once the interpreter is gone: they cannot be released then).
std::shared_ptr<void> python_builder_state(BuilderNames names, py::object fn) {
  auto* builder = new PythonBuilder{std::move(names), std::move(fn)};
  return std::shared_ptr<void>(builder, [](void* p) {
    if (interpreter_gone()) return;
    py::gil_scoped_acquire gil;
    delete static_cast<PythonBuilder*>(p);
  });
}

kvcore::CacheRegistry& caches() { return kvcore::global_caches(); }
kvcore::CacheBuilderRegistry& builders() { return kvcore::global_builders(); }

}  // namespace

void register_registry(py::module_& m) {
  // Python's registries are the process registries C++ code sees via global().
  throw_if_error(kvcore::register_default_builders(builders()));

  m.attr("registry_storage_v2") =
      py::capsule(static_cast<void*>(&kvcore::registry_storage()), KVCORE_REGISTRY_CAPSULE_NAME);
  m.attr("REGISTRY_ABI_VERSION") = kvcore::kRegistryAbiVersion;

  // --- caches by key ----------------------------------------------------------
  m.def("registry_install",
        [](const std::string& key, std::shared_ptr<kvcore::CacheBase> cache) {
          if (!cache) raise(kvcore::Error::InvalidArgument, "install: cache is None");
          throw_if_error(caches().install(key, std::move(cache)));
        },
        py::arg("key"), py::arg("cache").none(true),
        "Installs cache under key in the process registry. AlreadyRegisteredError: the key is taken; "
        "InvalidArgumentError: an empty or too long key, or cache None.");
  m.def("registry_install_unique",
        [](const std::string& prefix, std::shared_ptr<kvcore::CacheBase> cache) {
          if (!cache) raise(kvcore::Error::InvalidArgument, "install_unique: cache is None");
          return std::string(unwrap(caches().install_unique(prefix, std::move(cache))).view());
        },
        py::arg("prefix"), py::arg("cache").none(true),
        "Installs cache under a fresh key 'prefix#N' and returns the key. InvalidArgumentError: a bad "
        "prefix or cache None.");
  m.def("registry_get", [](const std::string& key) { return caches().get(key); }, py::arg("key"),
        "The cache under key, or None.");
  m.def("registry_find", [](const std::string& key) { return unwrap(caches().find(key)); },
        py::arg("key"), "The cache under key. NotFoundError naming the key when there is none.");
  m.def("registry_contains", [](const std::string& key) { return caches().contains(key); },
        py::arg("key"), "Whether a cache is installed under key.");
  m.def("registry_erase", [](const std::string& key) { throw_if_error(caches().erase(key)); },
        py::arg("key"), "Removes key (holders keep the cache alive). NotFoundError: no such key.");
  m.def("registry_erase_if_same",
        [](const std::string& key, const std::shared_ptr<kvcore::CacheBase>& cache) {
          throw_if_error(caches().erase_if_same(key, cache.get()));
        },
        py::arg("key"), py::arg("cache"),
        "Removes key only while it still names this cache (a session's cleanup). NotFoundError: "
        "the key is absent or names another cache.");
  m.def("registry_keys", [] {
    std::vector<std::string> out;
    for (const kvcore::Key& key : unwrap(caches().keys())) out.emplace_back(key.view());
    return out;
  },
  "The installed keys, sorted.");
  m.def("registry_unique_key",
        [](const std::string& prefix) { return std::string(unwrap(caches().make_unique_key(prefix)).view()); },
        py::arg("prefix") = "cache",
        "A key 'prefix#N' no cache is installed under (reserves nothing). InvalidArgumentError: a "
        "bad prefix.");

  // --- builders by (backend, kind) ----------------------------------------------
  m.def("register_builder",
        [](const std::string& backend_id, const std::string& kind, py::object fn) {
          if (!PyCallable_Check(fn.ptr())) {
            const std::string type = py::str(py::type::of(fn).attr("__name__"));
            raise(kvcore::Error::InvalidArgument,
                  "register_builder('" + backend_id + "', '" + kind + "'): builder is a " + type +
                      ", not a callable");
          }
          kvcore::CacheBuilder builder(&call_python_builder,
                                       python_builder_state({backend_id, kind}, std::move(fn)));
          throw_if_error(builders().register_builder(backend_id, kind, std::move(builder)));
        },
        py::arg("backend"), py::arg("kind"), py::arg("fn"),
        "Registers fn(config) -> cache as the builder of (backend, kind); C++ callers reach it too "
        "(they take the GIL). AlreadyRegisteredError: the pair has a builder; InvalidArgumentError: "
        "fn is not callable or a name is bad.");
  m.def("unregister_builder",
        [](const std::string& backend_id, const std::string& kind) {
          throw_if_error(builders().unregister_builder(backend_id, kind));
        },
        py::arg("backend"), py::arg("kind"),
        "Removes the builder of (backend, kind). NotFoundError: it has none.");
  m.def("has_builder",
        [](const std::string& backend_id, const std::string& kind) {
          return builders().contains(backend_id, kind);
        },
        py::arg("backend"), py::arg("kind"), "Whether (backend, kind) has a builder.");
  m.def("builders", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const kvcore::BuilderName& name : unwrap(builders().keys()))
      out.emplace_back(name.backend_id.view(), name.kind.view());
    return out;
  },
  "The (backend, kind) pairs that have a builder, sorted.");
  m.def("build",
        [](const std::string& backend_id, const std::string& kind, const kvcore::CacheConfig& cfg) {
          PythonBuildFrame frame;
          kvcore::Result<std::shared_ptr<kvcore::CacheBase>> built = [&] {
            py::gil_scoped_release release;  // C++ builders run without the GIL
            return builders().build(backend_id, kind, cfg);
          }();
          if (!built.ok() && frame.raised) {
            PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(frame.raised.ptr())),
                            frame.raised.ptr());
            throw py::error_already_set();
          }
          return unwrap(std::move(built));
        },
        py::arg("backend"), py::arg("kind"), py::arg("config"),
        "Builds a cache with the builder of (backend, kind). NotFoundError: none registered; "
        "InvalidArgumentError: config breaks a rule; a Python builder's exception propagates "
        "unchanged; InternalError: a builder returned None or a non-cache.");
}

}  // namespace kvcore_py
