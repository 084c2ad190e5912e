// A second extension module, built by tests/python/test_capsule.py the way an
// embedded backend is built (hidden visibility, no exceptions, no RTTI). It
// reaches kvcore's registries only through the PyCapsule (python_capsule.h).
#include <Python.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "kvcore/registry/default_builders.h"
#include "kvcore/adapters/python_capsule.h"
#include "kvcore/core/sequence_cache.h"

namespace {

kvcore::RegistryStorage* g_storage = nullptr;
std::atomic<int> g_probe_builds{0};

PyObject* raise(const kvcore::Status& s) {
  PyErr_Format(PyExc_RuntimeError, "kvcore error 0x%02x: %s", static_cast<unsigned>(s.code()),
               s.message().c_str());
  return nullptr;
}

bool attach() {
  if (g_storage != nullptr) return true;
  auto storage = kvcore::python::import_registry_storage();
  if (!storage.ok()) {
    raise(storage.status());
    return false;
  }
  g_storage = storage.get();
  return true;
}

kvcore::CacheConfig flat_config(int capacity) {
  kvcore::CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.n_layers = 1;
  cfg.layers = {kvcore::LayerConfig{kvcore::LayerPolicy::flat(), 1, 4, 0}};
  return cfg;
}

kvcore::Result<std::shared_ptr<kvcore::CacheBase>> probe_builder(const kvcore::CacheConfig& cfg) {
  ++g_probe_builds;
  return kvcore::build_sequence_cache(cfg);
}

// storage_address() -> int: where the registry storage this module uses lives.
PyObject* storage_address(PyObject*, PyObject*) {
  if (!attach()) return nullptr;
  return PyLong_FromVoidPtr(g_storage);
}

// capacity(key) -> int: the capacity of the cache under key, -1 when absent.
PyObject* capacity(PyObject*, PyObject* args) {
  const char* key = nullptr;
  if (!PyArg_ParseTuple(args, "s", &key) || !attach()) return nullptr;
  std::shared_ptr<kvcore::CacheBase> cache = g_storage->caches.get(key);
  if (cache == nullptr || cache->as_control() == nullptr) return PyLong_FromLong(-1);
  return PyLong_FromLong(cache->as_control()->capacity());
}

// install_sequence(key, capacity): a SequenceCache made here, installed there.
PyObject* install_sequence(PyObject*, PyObject* args) {
  const char* key = nullptr;
  int cap = 0;
  if (!PyArg_ParseTuple(args, "si", &key, &cap) || !attach()) return nullptr;
  auto made = kvcore::build_sequence_cache(flat_config(cap));
  if (!made.ok()) return raise(made.status());
  kvcore::Status s = g_storage->caches.install(key, made.get());
  if (!s.ok()) return raise(s);
  Py_RETURN_NONE;
}

// erase(key) -> int: the kvcore code of the erase.
PyObject* erase(PyObject*, PyObject* args) {
  const char* key = nullptr;
  if (!PyArg_ParseTuple(args, "s", &key) || !attach()) return nullptr;
  return PyLong_FromLong(static_cast<long>(g_storage->caches.erase(key).code()));
}

// register_builder(backend, kind): a C++ builder of this module.
PyObject* register_builder(PyObject*, PyObject* args) {
  const char *backend = nullptr, *kind = nullptr;
  if (!PyArg_ParseTuple(args, "ss", &backend, &kind) || !attach()) return nullptr;
  kvcore::Status s = g_storage->builders.register_builder(backend, kind, &probe_builder);
  if (!s.ok()) return raise(s);
  Py_RETURN_NONE;
}

PyObject* probe_builds(PyObject*, PyObject*) { return PyLong_FromLong(g_probe_builds.load()); }

// build_capacity(backend, kind, capacity, release_gil) -> int: builds from C++
// (optionally without the GIL, as a runner thread would) and returns the
// built cache's capacity; the kvcore error becomes RuntimeError.
PyObject* build_capacity(PyObject*, PyObject* args) {
  const char *backend = nullptr, *kind = nullptr;
  int cap = 0, release_gil = 0;
  if (!PyArg_ParseTuple(args, "ssip", &backend, &kind, &cap, &release_gil) || !attach())
    return nullptr;
  const kvcore::CacheConfig cfg = flat_config(cap);
  kvcore::Status status;
  int built_capacity = -1;
  auto run = [&] {
    auto built = g_storage->builders.build(backend, kind, cfg);
    if (!built.ok()) {
      status = built.status();
      return;
    }
    kvcore::SequenceControl* control = built.get()->as_control();
    built_capacity = control != nullptr ? control->capacity() : -2;
  };
  if (release_gil) {
    Py_BEGIN_ALLOW_THREADS run();
    Py_END_ALLOW_THREADS
  } else {
    run();
  }
  if (!status.ok()) return raise(status);
  return PyLong_FromLong(built_capacity);
}

// build_in_threads(backend, kind, capacity, threads, per_thread) -> int: that
// many C++ threads (which never held the GIL) build concurrently while this
// thread waits without the GIL; returns how many builds succeeded.
PyObject* build_in_threads(PyObject*, PyObject* args) {
  const char *backend = nullptr, *kind = nullptr;
  int cap = 0, n_threads = 0, per_thread = 0;
  if (!PyArg_ParseTuple(args, "ssiii", &backend, &kind, &cap, &n_threads, &per_thread) || !attach())
    return nullptr;
  const kvcore::CacheConfig cfg = flat_config(cap);
  std::atomic<int> ok{0};
  kvcore::CacheBuilderRegistry* builders = &g_storage->builders;
  Py_BEGIN_ALLOW_THREADS {
    std::vector<std::thread> threads;
    for (int t = 0; t < n_threads; ++t)
      threads.emplace_back([&] {
        for (int i = 0; i < per_thread; ++i)
          if (builders->build(backend, kind, cfg).ok()) ++ok;
      });
    for (auto& th : threads) th.join();
  }
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(ok.load());
}

PyMethodDef kMethods[] = {
    {"storage_address", storage_address, METH_NOARGS, nullptr},
    {"capacity", capacity, METH_VARARGS, nullptr},
    {"install_sequence", install_sequence, METH_VARARGS, nullptr},
    {"erase", erase, METH_VARARGS, nullptr},
    {"register_builder", register_builder, METH_VARARGS, nullptr},
    {"probe_builds", probe_builds, METH_NOARGS, nullptr},
    {"build_capacity", build_capacity, METH_VARARGS, nullptr},
    {"build_in_threads", build_in_threads, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "kvcore_capsule_probe", nullptr, -1, kMethods,
                       nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_kvcore_capsule_probe(void) { return PyModule_Create(&kModule); }
