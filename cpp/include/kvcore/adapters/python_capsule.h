// Reaching kvcore's registries from another Python extension module.
//
// Python loads extension modules with RTLD_LOCAL, so a module compiled from
// the kvcore headers cannot link against kvcore._core to share its storage.
// kvcore._core publishes its RegistryStorage in a PyCapsule named
// KVCORE_REGISTRY_CAPSULE_NAME (attribute `registry_storage_v2`); this header
// imports it and checks it is ABI-compatible with the caller:
//
//   auto storage = kvcore::python::import_registry_storage();  // GIL held
//   if (!storage.ok()) { /* raise, e.g. with storage.message() */ }
//   storage.get()->caches.find(key); storage.get()->builders.build(...);
//
// The storage is never freed, so the pointer may be kept for the life of the
// process. Its registries are thread-safe and need no GIL; a builder
// registered from Python takes the GIL itself when it runs.
// Needs Python.h (include it first, as Python asks); nothing of pybind11.
#pragma once

#include <Python.h>

#include "kvcore/registry/registry_storage.h"
#include "kvcore/core/result.h"

/// The capsule's name: PyCapsule_Import() reads it as "module.attribute".
/// The trailing version changes with kRegistryAbiVersion.
#define KVCORE_REGISTRY_CAPSULE_NAME "kvcore._core.registry_storage_v2"

namespace kvcore {
namespace python {

/// The registry storage of the kvcore package this interpreter imports.
/// Call with the GIL held. NotFound: kvcore._core cannot be imported or has no
/// such capsule (the Python error is cleared; its text is in the message).
/// NotSupported: the storage fails check_registry_storage() (another kvcore
/// ABI version or standard library).
inline Result<RegistryStorage*> import_registry_storage() noexcept {
  void* pointer = PyCapsule_Import(KVCORE_REGISTRY_CAPSULE_NAME, 0);
  if (pointer == nullptr) {
    Status status = Status::make(Error::NotFound, "cannot import " KVCORE_REGISTRY_CAPSULE_NAME);
#if PY_VERSION_HEX >= 0x030C0000
    PyObject* raised = PyErr_GetRaisedException();
#else
    PyObject *type = nullptr, *raised = nullptr, *traceback = nullptr;
    PyErr_Fetch(&type, &raised, &traceback);
    PyErr_NormalizeException(&type, &raised, &traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
#endif
    if (raised != nullptr) {
      PyObject* text = PyObject_Str(raised);
      const char* utf8 = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
      if (utf8 != nullptr) {
        // The name is part of the literal, so the reason gets all of a text argument's
        // room: Status::kArgBytes - 2 (54) characters, longer ones end in "...".
        status = Status::make(Error::NotFound, "cannot import " KVCORE_REGISTRY_CAPSULE_NAME ": %s", utf8);
      }
      Py_XDECREF(text);
      Py_DECREF(raised);
    }
    PyErr_Clear();
    return status;
  }
  RegistryStorage* storage = static_cast<RegistryStorage*>(pointer);
  KVCORE_RETURN_IF_ERROR(check_registry_storage(storage));
  return storage;
}

}  // namespace python
}  // namespace kvcore
