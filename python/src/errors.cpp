#include "errors.h"

namespace kvcore_py {

void register_errors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object errors = py::module_::import("kvcore._errors");
      py::object cls = errors.attr("error_class")(static_cast<std::uint32_t>(e.code()));
      py::object exc = cls(e.what());
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });

  // The codes as C++ names them, so tests can prove the Python enum agrees.
  m.def("error_codes", [] {
    py::dict codes;
    using kvcore::Error;
    for (Error e : {Error::Ok, Error::Internal, Error::InvalidState, Error::NotSupported,
                    Error::InvalidArgument, Error::RegistrationAlreadyRegistered, Error::NotFound,
                    Error::MemoryAllocationFailed, Error::OutOfResources}) {
      codes[kvcore::to_string(e)] = static_cast<std::uint32_t>(e);
    }
    return codes;
  },
  "kvcore::Error names and values as the C++ core defines them (ExecuTorch's Error values).");
}

}  // namespace kvcore_py
