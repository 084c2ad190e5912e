#!/usr/bin/env bash
# The header check with a second compiler (ctest -R header_check): every public
# header but adapters/ compiled alone, as the kvcore_header_check target does
# with the configured compiler, under the strict flags and -Wconversion
# -Wsign-conversion -Werror. Exit 77 (skipped) without the compiler.
#
#   tests/cpp/header_check.sh SOURCE_DIR WORK_DIR CXX
set -uo pipefail
SRC=$1
WORK=$2
CXX=$3
command -v "$CXX" >/dev/null || { echo "skipped: $CXX not found"; exit 77; }
mkdir -p "$WORK"
failed=0
checked=0
while IFS= read -r header; do
  name=${header#"$SRC/cpp/include/"}
  src="$WORK/$(echo "$name" | tr '/.' '__').cpp"
  printf '#include "%s"\n' "$name" >"$src"
  checked=$((checked + 1))
  if ! "$CXX" -std=c++17 -fsyntax-only -fno-exceptions -fno-rtti -Wall -Wextra -Wpedantic -Wconversion \
       -Wsign-conversion -Werror -I"$SRC/cpp/include" "$src"; then
    echo "FAIL  $name"
    failed=$((failed + 1))
  fi
done < <(find "$SRC/cpp/include/kvcore" -name '*.h' ! -path '*/adapters/*' | sort)
echo "$CXX: $checked headers compiled alone, $failed failed"
[ "$failed" = 0 ]
