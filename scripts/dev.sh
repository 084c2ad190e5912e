#!/usr/bin/env bash
# Builds kvcore._core into build/dev-NAME and stages an importable package there,
# without touching site-packages (several people can build side by side).
# Usage: eval "$(scripts/dev.sh NAME)"   -> exports PYTHONPATH to the staged package.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
NAME=${1:-default}
OUT=$ROOT/build/dev-$NAME
PYTHON=${PYTHON:-python3}
cmake -S "$ROOT" -B "$OUT/cmake" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVCORE_BUILD_PYTHON=ON -DKVCORE_BUILD_TESTS=OFF \
  -Dpybind11_DIR="$("$PYTHON" -m pybind11 --cmakedir)" -DPython_EXECUTABLE="$(command -v "$PYTHON")" >&2
cmake --build "$OUT/cmake" --target _core >&2
rm -rf "$OUT/site/kvcore" "$OUT/site/kvcore_demo" && mkdir -p "$OUT/site/kvcore"
ln -s "$ROOT/python/kvcore_demo" "$OUT/site/kvcore_demo"  # the demos: a package of their own
# Symlink the sources so edits to .py files need no re-run; only new files do.
for f in "$ROOT"/python/kvcore/*; do ln -s "$f" "$OUT/site/kvcore/"; done
cp "$OUT"/cmake/python/_core*.so "$OUT/site/kvcore/"
echo "export PYTHONPATH=$OUT/site\${PYTHONPATH:+:\$PYTHONPATH}"
