// The C interface of the test libraries built from xlib.cpp. Each library
// gets its own symbol prefix (XLIB_NAME), so the test executable can load all
// of them side by side.
#pragma once

#define XLIB_CAT2(a, b) a##_##b
#define XLIB_CAT(a, b) XLIB_CAT2(a, b)

#define XLIB_DECLARE(name)                                                                \
  extern "C" {                                                                            \
  /* Builds ("cpu", "sequence") through the global builder registry and installs it. */  \
  int XLIB_CAT(name, install_sequence)(const char* key, int capacity);                  \
  /* Capacity of the cache under `key` in the global registry; -1 when absent. */         \
  int XLIB_CAT(name, capacity)(const char* key);                                          \
  int XLIB_CAT(name, erase)(const char* key);                                             \
  const void* XLIB_CAT(name, registry_address)(void);                                     \
  /* Registers a builder defined in this library that counts its calls. */                \
  int XLIB_CAT(name, register_counting_builder)(const char* backend, const char* kind);  \
  int XLIB_CAT(name, builds_made)(void);                                                  \
  /* Builds (backend, kind) through the global builder registry and installs it. */       \
  int XLIB_CAT(name, build_and_install)(const char* backend, const char* kind,           \
                                         const char* key, int capacity);                  \
  }

XLIB_DECLARE(kvcore_xlib_runner)
XLIB_DECLARE(kvcore_xlib_backend)
XLIB_DECLARE(kvcore_xlib_local_a)
XLIB_DECLARE(kvcore_xlib_local_b)
