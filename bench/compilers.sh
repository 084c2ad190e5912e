#!/usr/bin/env bash
# Planning cost and code size with both compilers, side by side in one run:
# builds kvcore_bench with g++ and with clang++ (Release, -O2, no exceptions or
# RTTI), runs their planning benchmarks alternately ROUNDS times (interleaved,
# so load on the shared machine hits both alike), and compiles
# the runners at -Os with each to measure the .text they link:
# bench/planner_runner.cpp (the core alone), bench/session_runner.cpp (registry
# + session, sequence builders only) and the same with every kind
# (-DKVCORE_RUNNER_ALL_KINDS, register_default_builders()).
# Writes bench/results/compilers.json (or $1) and prints a table.
#
#   bash bench/compilers.sh [OUT.json]     (needs libbenchmark-dev and clang)
#   SIZES_ONLY=1 bash bench/compilers.sh   (the .text only: prints, writes nothing)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/compilers.json}
ROUNDS=${ROUNDS:-5}
BUILD=build/bench-compilers
FILTER='^(plan_step|plan_step_faces|plan_step_shared|memcpy_step_kv)/T:1$'

# text CXX NAME SOURCE [FLAGS...]: compiles, links and runs a runner; prints its object's .text bytes.
text() {
  local cxx=$1 name=$2 source=$3
  shift 3
  local obj="$BUILD/$cxx/$name.o"
  mkdir -p "$BUILD/$cxx"
  "$cxx" -std=c++17 -Os -fno-exceptions -fno-rtti -Icpp/include "$@" -c "$source" -o "$obj"
  "$cxx" "$obj" -o "$BUILD/$cxx/$name" && "$BUILD/$cxx/$name" >/dev/null
  size -A "$obj" | awk '/^\.text/ {sum += $2} END {print sum}'
}

sizes=()
for cxx in g++ clang++; do
  planner=$(text "$cxx" planner_runner bench/planner_runner.cpp)
  session=$(text "$cxx" session_runner bench/session_runner.cpp)
  all=$(text "$cxx" session_runner_all bench/session_runner.cpp -DKVCORE_RUNNER_ALL_KINDS)
  sizes+=("$cxx=$planner,$session,$all")
done
if [ "${SIZES_ONLY:-0}" = 1 ]; then
  printf '%-9s %22s %28s %26s\n' compiler "planner runner .text" "session (sequence) .text" "session (all kinds) .text"
  for item in "${sizes[@]}"; do
    IFS=, read -r planner session all <<<"${item#*=}"
    printf '%-9s %20d B %26d B %24d B\n' "${item%%=*}" "$planner" "$session" "$all"
  done
  exit 0
fi

for cxx in g++ clang++; do
  cmake -S . -B "$BUILD/$cxx" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
    -DKVCORE_BUILD_TESTS=OFF -DKVCORE_BUILD_BENCH=ON >/dev/null
  cmake --build "$BUILD/$cxx" --target kvcore_bench >/dev/null
done

runs=()
for round in $(seq "$ROUNDS"); do
  for cxx in g++ clang++; do
    out="$BUILD/$cxx/round$round.json"
    "$BUILD/$cxx/bench/kvcore_bench" --benchmark_filter="$FILTER" --benchmark_repetitions=3 2>/dev/null \
      --benchmark_report_aggregates_only=true --benchmark_out="$out" --benchmark_out_format=json >/dev/null
    runs+=("$cxx=$out")
  done
done

python3 - "$OUT" "${runs[@]}" -- "${sizes[@]}" <<'PY'
import json, statistics, sys
out, rest = sys.argv[1], sys.argv[2:]
split = rest.index("--")
runs, sizes = rest[:split], rest[split + 1:]
times = {}  # (compiler, benchmark) -> per-round medians, ns
for item in runs:
    cxx, path = item.split("=", 1)
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") == "median":
            times.setdefault((cxx, b["run_name"]), []).append(b["real_time"])
result = {"rounds": len(runs) // 2, "load": open("/proc/loadavg").read().split()[:3], "compilers": {}}
print(f"{'compiler':<9} {'benchmark':<22} {'ns (median of rounds)':>22} {'% of copy floor':>16}")
for cxx in ("g++", "clang++"):
    floor = statistics.median(times[(cxx, "memcpy_step_kv/T:1")])
    entry = {"copy_floor_ns": floor, "plan": {}}
    for name in ("plan_step/T:1", "plan_step_faces/T:1", "plan_step_shared/T:1"):
        ns = statistics.median(times[(cxx, name)])
        entry["plan"][name] = {"ns": ns, "rounds_ns": times[(cxx, name)], "percent_of_floor": 100 * ns / floor}
        print(f"{cxx:<9} {name:<22} {ns:>22,.0f} {100 * ns / floor:>15.3f}%")
    print(f"{cxx:<9} {'memcpy_step_kv/T:1':<22} {floor:>22,.0f}")
    result["compilers"][cxx] = entry
for item in sizes:
    cxx, texts = item.split("=")
    planner, session, every = (int(t) for t in texts.split(","))
    entry = result["compilers"][cxx]
    entry["planner_runner_text_bytes_Os"] = planner
    entry["session_runner_text_bytes_Os"] = session
    entry["session_runner_all_kinds_text_bytes_Os"] = every
    print(f"{cxx:<9} .text at -Os: planner-only runner {planner:,} B, registry + session "
          f"(sequence builders) {session:,} B, (every kind) {every:,} B")
with open(out, "w") as f:
    json.dump(result, f, indent=1)
    f.write("\n")
PY
