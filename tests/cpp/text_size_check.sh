#!/usr/bin/env bash
# The size test (ctest -R text_size): what an embedded runner links, built the
# way one builds it (g++ -Os -fno-exceptions -fno-rtti), each program's .text
# summed over the object's .text sections as bench/compilers.sh reads it:
#   bench/planner_runner.cpp   the core planning steps, nothing else   < 13,500 B
#   bench/session_runner.cpp   registry + session, sequence builders    < 21,500 B
#                              only; its linked binary has no BatchCache symbol
#   the same, -DKVCORE_RUNNER_ALL_KINDS (register_default_builders()):
#                              links BatchCache (so the check above can fail)
# Each program also runs. Exit 77 (skipped) without g++, size or nm.
#
#   tests/cpp/text_size_check.sh SOURCE_DIR WORK_DIR [CXX]
set -uo pipefail
SRC=$1
WORK=$2
CXX=${3:-g++}
# The limits: this file is their one source; docs/registry.md states them and
# what the layer kinds cost, tests/python/test_limits_doc.py keeps the docs in step.
# Measured with g++ 12.2 (Debian 12), 2026-12-05: planner 13,029 B, session
# 20,895 B, so the limits leave 471 B (3.6%) and 605 B (2.9%). The five layer
# kinds of docs/design.md section 9 cost 3.3 KB of that over the two before
# them (flat and ring: 9,711 B and 17,625 B, 2026-12-02): SequenceCache builds
# each layer's policy through make_policy, which names every kind, so a runner
# links all five whichever its model uses.
PLANNER_LIMIT=13500
SESSION_LIMIT=21500
for tool in "$CXX" size nm; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool not found"; exit 77; }
done
mkdir -p "$WORK"
status=0

# build NAME SOURCE [FLAGS...]: compiles, links and runs; prints the .text bytes.
build() {
  local name=$1 source=$2
  shift 2
  "$CXX" -std=c++17 -Os -fno-exceptions -fno-rtti -I"$SRC/cpp/include" "$@" -c "$source" -o "$WORK/$name.o" &&
    "$CXX" "$WORK/$name.o" -o "$WORK/$name" && "$WORK/$name" >/dev/null ||
    { echo "FAIL: $name did not build or run" >&2; return 1; }
  size -A "$WORK/$name.o" | awk '/^\.text/ {sum += $2} END {print sum}'
}

# check NAME BYTES LIMIT
check() {
  if [ "$2" -lt "$3" ]; then
    printf 'ok    %-32s .text %6d B (limit %d B)\n' "$1" "$2" "$3"
  else
    printf 'FAIL  %-32s .text %6d B (limit %d B)\n' "$1" "$2" "$3"
    status=1
  fi
}

planner=$(build planner_runner "$SRC/bench/planner_runner.cpp") || exit 1
check "planner alone" "$planner" "$PLANNER_LIMIT"
session=$(build session_runner "$SRC/bench/session_runner.cpp") || exit 1
check "registry + session (sequence)" "$session" "$SESSION_LIMIT"
batch_symbols=$(nm -C "$WORK/session_runner" | grep -c 'BatchCache')
if [ "$batch_symbols" = 0 ]; then
  echo "ok    the sequence-only runner links no BatchCache symbol"
else
  echo "FAIL  the sequence-only runner links $batch_symbols BatchCache symbols:"
  nm -C "$WORK/session_runner" | grep 'BatchCache' | head -5
  status=1
fi
all=$(build session_runner_all "$SRC/bench/session_runner.cpp" -DKVCORE_RUNNER_ALL_KINDS) || exit 1
all_symbols=$(nm -C "$WORK/session_runner_all" | grep -c 'BatchCache')
if [ "$all_symbols" -gt 0 ]; then
  printf 'ok    %-32s .text %6d B, %d BatchCache symbols (no limit)\n' "registry + session (default)" "$all" "$all_symbols"
else
  echo "FAIL  register_default_builders() links no BatchCache: the symbol check above proves nothing"
  status=1
fi
exit $status
