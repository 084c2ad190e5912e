# The ExecuTorch adapter test, compiled against the executorch wheel's headers
# and linked to its libexecutorch.so. The wheel is found through the Python
# interpreter without importing executorch (importing it would need torch).
# When it is absent the target is skipped with the reason, unless
# KVCORE_REQUIRE_EXECUTORCH is ON (CI), which makes that an error.
option(KVCORE_REQUIRE_EXECUTORCH "Fail configuration when the executorch wheel is missing" OFF)
set(KVCORE_EXECUTORCH_ROOT "" CACHE PATH
    "The executorch package directory of an installed executorch wheel; found through Python when empty")

set(_et_root "${KVCORE_EXECUTORCH_ROOT}")
set(_et_reason "")
if(NOT _et_root)
  find_package(Python COMPONENTS Interpreter QUIET)
  if(NOT Python_Interpreter_FOUND)
    set(_et_reason "no Python interpreter to locate the executorch wheel with")
  else()
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c
              "import importlib.util as u; s = u.find_spec('executorch'); print(next(iter(s.submodule_search_locations), '') if s and s.submodule_search_locations else '')"
      OUTPUT_VARIABLE _et_root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT _et_root)
      set(_et_reason "${Python_EXECUTABLE} finds no executorch package (pip install --no-deps executorch==1.5.1)")
    endif()
  endif()
endif()
if(_et_root AND NOT _et_reason)
  foreach(_needed include/executorch/runtime/core/error.h include/executorch/runtime/core/result.h
                  lib/libexecutorch.so)
    if(NOT EXISTS "${_et_root}/${_needed}")
      set(_et_reason "${_et_root} has no ${_needed}")
      break()
    endif()
  endforeach()
endif()

if(_et_reason)
  if(KVCORE_REQUIRE_EXECUTORCH)
    message(FATAL_ERROR "kvcore: ExecuTorch adapter test required but unavailable: ${_et_reason}")
  endif()
  message(STATUS "kvcore: skipping the ExecuTorch adapter test: ${_et_reason}")
  return()
endif()
message(STATUS "kvcore: ExecuTorch adapter test against ${_et_root}")

# The runtime as the wheel ships it. Its headers are SYSTEM (imported), so our
# strict warnings judge our code only. C10_USING_CUSTOM_GENERATED_MACROS is
# what the wheel's package config asks consumers to define (its vendored c10
# headers otherwise want a header generated inside a PyTorch build).
add_library(kvcore_executorch_runtime SHARED IMPORTED)
set_target_properties(kvcore_executorch_runtime PROPERTIES
  IMPORTED_LOCATION "${_et_root}/lib/libexecutorch.so"
  IMPORTED_NO_SONAME FALSE
  INTERFACE_INCLUDE_DIRECTORIES "${_et_root}/include"
  INTERFACE_COMPILE_DEFINITIONS C10_USING_CUSTOM_GENERATED_MACROS)

add_executable(kvcore_executorch_tests ${CMAKE_CURRENT_SOURCE_DIR}/executorch_adapter_test.cpp)
target_link_libraries(kvcore_executorch_tests PRIVATE kvcore::kvcore kvcore_executorch_runtime
                                                      GTest::gtest GTest::gtest_main)
target_compile_options(kvcore_executorch_tests PRIVATE ${KVCORE_STRICT_FLAGS})
# The build tree runs against the wheel's library in place.
set_target_properties(kvcore_executorch_tests PROPERTIES BUILD_RPATH "${_et_root}/lib")
gtest_discover_tests(kvcore_executorch_tests DISCOVERY_MODE PRE_TEST)

# kvcore/adapters/executorch.h compiles alone under the strict flags too.
set(_et_header_src ${CMAKE_CURRENT_BINARY_DIR}/header_check/executorch.cpp)
file(WRITE ${_et_header_src}.in "#include \"kvcore/adapters/executorch.h\"\n")
configure_file(${_et_header_src}.in ${_et_header_src} COPYONLY)
add_library(kvcore_executorch_header_check OBJECT ${_et_header_src})
target_link_libraries(kvcore_executorch_header_check PRIVATE kvcore::kvcore kvcore_executorch_runtime)
target_compile_options(kvcore_executorch_header_check PRIVATE ${KVCORE_STRICT_FLAGS})
