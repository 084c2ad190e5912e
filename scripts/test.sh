#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test: the C++ suite
# (ctest, built without exceptions or RTTI) and the Python suite (pytest).
# Exits non-zero when anything fails.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${KVCORE_BUILD_DIR:-$ROOT/build/cpp}
PYTHON=${PYTHON:-python3}

step() { printf '\n==> %s\n' "$*"; }

# --- system packages (Debian) ---------------------------------------------
apt_missing=()
[ -f /usr/include/gtest/gtest.h ] || apt_missing+=(libgtest-dev)
[ -f /usr/include/benchmark/benchmark.h ] || apt_missing+=(libbenchmark-dev)  # bench/ smoke run
command -v ninja >/dev/null || apt_missing+=(ninja-build)
command -v cmake >/dev/null || apt_missing+=(cmake)
if [ ${#apt_missing[@]} -gt 0 ]; then
  step "apt-get install ${apt_missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${apt_missing[@]}" >/dev/null || exit 1
fi

# --- Python build and test dependencies, then the package itself ------------
step "pip install build and test dependencies, then kvcore"
"$PYTHON" -m pip install -q --disable-pip-version-check \
  "scikit-build-core>=0.10" "pybind11>=2.12" numpy pytest hypothesis mypy || exit 1
"$PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation ".[test]" || exit 1
# The ExecuTorch adapter test compiles against this wheel's headers and links its
# libexecutorch.so; --no-deps because only those files are needed (not torch).
"$PYTHON" -m pip install -q --disable-pip-version-check --no-deps "executorch==1.5.1" || exit 1
# The transformers integration tests run against the versions docs/transformers.md
# names: torch first (the local CPU wheel), so transformers cannot pull another.
"$PYTHON" -m pip install -q --disable-pip-version-check "torch==2.13.0" || exit 1
"$PYTHON" -m pip install -q --disable-pip-version-check "transformers==5.24.0" "torch==2.13.0" || exit 1

status=0

# --- C++ ---------------------------------------------------------------------
step "C++: configure, build (header check, benchmarks included), ctest (benchmark smoke run included)"
if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVCORE_BUILD_TESTS=ON -DKVCORE_BUILD_BENCH=ON \
     -DKVCORE_REQUIRE_EXECUTORCH=ON -DPython_EXECUTABLE="$(command -v "$PYTHON")" >/dev/null &&
   cmake --build "$BUILD" --parallel; then
  ctest --test-dir "$BUILD" --output-on-failure --parallel 2 || status=1
else
  echo "C++ build failed"; status=1
fi

# --- Python ------------------------------------------------------------------
step "Python: mypy --strict, stubtest, pytest"
(cd "$ROOT" && "$PYTHON" -m mypy --strict python/kvcore) || status=1
(cd /tmp && "$PYTHON" -m mypy.stubtest kvcore --allowlist "$ROOT/tests/python/stubtest_allowlist.txt") || status=1
(cd "$ROOT" && "$PYTHON" -m pytest tests/python -q -p no:cacheprovider) || status=1

step "summary: $([ $status = 0 ] && echo 'all tests passed' || echo 'FAILURES above')"
exit $status
