#!/usr/bin/env python3
"""Mutation testing of the C++ core: small semantic changes a real bug could
be, each applied to a header, built, tested and restored. A mutant the tests
fail on (or that fails to build, or times out) is killed; one they pass is a
survivor, printed with its description. Not part of .ci/run: it rebuilds the
tests once per mutant (docs/robustness.md, "Mutation testing").

  scripts/mutate.py                 # every mutant, the ctest suite of build/mutate
  scripts/mutate.py --quick         # every mutant, only the test files it names (g++ -O1)
  scripts/mutate.py --only 1,7,9    # some mutants (numbers from --list)
  scripts/mutate.py --list

The default builds kvcore_tests in --build-dir (configured on first use) and
runs `ctest -R <the mutant's regex> --timeout <T> --stop-on-failure`, mutating
the tree (restored after every mutant, on Ctrl-C and on SIGTERM: build nothing
else from this checkout meanwhile). --quick compiles the mutant's own test
files into one binary against a mutated copy of the headers, never touching
the tree (much faster).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INC = "cpp/include/kvcore/"
# --quick's test files for the batch headers: the key table, the scenarios, the brute force.
BATCH_TESTS = ["block_pool_test.cpp", "batch_scenario_test.cpp", "batch_brute_force_test.cpp"]
BATCH_RE = "Batch|BlockPool|StepMask|Faces"
# --quick's test files for the quantized rows and the layer kinds (issue 43, item 6).
QUANT_TESTS = ["quantized_pool_test.cpp"]
QUANT_RE = "Quantiz"
KINDS_TESTS = ["layer_kinds_test.cpp", "layer_kinds_brute_force_test.cpp", "kv_pool_kinds_test.cpp"]
KINDS_RE = "LayerKinds|KVPoolKinds"


@dataclass
class Mutant:
    path: str  # under cpp/include/kvcore/
    old: str  # must occur exactly once
    new: str
    what: str
    tests: list[str]  # test files for --quick (tests/cpp/)
    regex: str = BATCH_RE  # the ctest subset


# PagedKVPool::update's two loops, for the mutant that swaps them.
PAGED_COPIES = """    for (int c = 0; c < gp.n_copies; ++c) {
      const BlockCopy& cp = gp.copies[c];
      if (cp.src == cp.dst) continue;
      std::memcpy(layer.k + k_block * static_cast<std::size_t>(cp.dst),
                  layer.k + k_block * static_cast<std::size_t>(cp.src), k_block);
      std::memcpy(layer.v + v_block * static_cast<std::size_t>(cp.dst),
                  layer.v + v_block * static_cast<std::size_t>(cp.src), v_block);
    }
"""
PAGED_WRITES = """    const unsigned char* k_in = static_cast<const unsigned char*>(k);
    const unsigned char* v_in = static_cast<const unsigned char*>(v);
    for (int t = 0; t < plan.n_tokens; ++t) {
      const std::size_t slot = static_cast<std::size_t>(gp.slots[t]);
      std::memcpy(layer.k + layer.k_row_bytes * slot, k_in + layer.k_row_bytes * static_cast<std::size_t>(t),
                  layer.k_row_bytes);
      std::memcpy(layer.v + layer.v_row_bytes * slot, v_in + layer.v_row_bytes * static_cast<std::size_t>(t),
                  layer.v_row_bytes);
    }
"""

MUTANTS = [
    # --- BlockPool (batch/block_pool.h) ---
    Mutant("batch/block_pool.h", "(home > i && home <= j) : (home > i || home <= j)",
           "(home >= i && home <= j) : (home >= i || home <= j)",
           "key table deletion: a key at home in the freed slot is not moved back (issue 23)", BATCH_TESTS),
    Mutant("batch/block_pool.h", "      link_before(block, n_blocks_);", "      link_before(block, next_[n_blocks_]);",
           "a released cached block goes to the LRU front (reclaimed first)", BATCH_TESTS),
    Mutant("batch/block_pool.h", "    if (heap_size_ > 0) {\n      b = pop_lowest();",
           "    if (heap_size_ > 0 && cached_ == 0) {\n      b = pop_lowest();",
           "allocation reclaims a cached block while unnamed ones are free", BATCH_TESTS),
    Mutant("batch/block_pool.h", "return held >= 0 ? held : cached;", "return cached >= 0 ? cached : held;",
           "a hit revives the cached copy though a held one exists", BATCH_TESTS),
    Mutant("batch/block_pool.h", "      if (older >= 0) {", "      if (older >= 0 && older < 0) {",
           "two cached copies of one content both stay cached", BATCH_TESTS),
    Mutant("batch/block_pool.h", "    while (used_ > 0 && refs_[used_ - 1] == 0) --used_;",
           "    while (used_ > 1 && refs_[used_ - 1] == 0) --used_;",
           "used_blocks never drops to 0", BATCH_TESTS),
    # --- BatchCache (batch/batch_cache.h) ---
    Mutant("batch/batch_cache.h", "if (cur < 0 || must_copy(pool, cur)) ++need;", "if (cur < 0) ++need;",
           "admission does not count copy-on-write blocks", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "return pool.refs(block) > 1 || pool.keyed(block);", "return pool.refs(block) > 1;",
           "a step writes into a named block in place", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "          if (before < 0) --held(g, seq);", "          (void)before;",
           "an abandoned step's fresh block stays counted in blocks_held (issue 23)", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "for (int i = seqs_[seq].alloc_end - 1; i >= from; --i) {",
           "for (int i = from; i < seqs_[seq].alloc_end; ++i) {",
           "a released sequence's blocks go head first", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "const int floor_block = static_cast<int>(floor / block_size_);",
           "const int floor_block = static_cast<int>(floor / block_size_) + 1;",
           "a ring's window releases one block too many", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "const int candidates = n > 0 ? (n - 1) / B : 0;", "const int candidates = n / B;",
           "adopt_prefix may adopt the prompt's last token", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "    if (!given) {\n      s.hashing = false;", "    if (!given) {\n      s.hashing = true;",
           "a step without tokens does not stop naming", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "      s.hashing = false;  // later rows were computed without the removed positions",
           "      // (mutant: naming goes on)",
           "a head removal does not stop naming", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "    if (n % block_size_ != 0) return false;\n    d.hashed_blocks",
           "    d.hashed_blocks",
           "a cut inside a full block keeps naming", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "        if (next_kept(dst, i * block_size_) >= hi) continue;  // dst sees none of its positions",
           "",
           "a fork shares blocks whose every position it removed", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "return Needed{group.sink_blocks, from > group.sink_blocks ? from : group.sink_blocks};",
           "return Needed{0, from};",
           "a ring prefix hit leaves the sink blocks out", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "if (needed < n && needed < hi) return g;", "if (needed + 1 < n && needed < hi) return g;",
           "the rewind rule lets a query lose its oldest needed key", BATCH_TESTS),
    Mutant("batch/batch_cache.h",
           "for (int c = 0; c < group_plans_[g].n_copies; ++c) groups_[g].pool.release(copies_[g * max_seqs_ + c].src);",
           "for (int c = 1; c < group_plans_[g].n_copies; ++c) groups_[g].pool.release(copies_[g * max_seqs_ + c].src);",
           "commit keeps holding a copy source", BATCH_TESTS),
    Mutant("batch/batch_cache.h", "if (table(g, seq)[first] != first_before_[g * max_seqs_ + i]) ++n;",
           "if (table(g, seq)[first] != first_before_[g * max_seqs_ + i]) n += 0;",
           "a retry's admission forgets the replaced step's first blocks", BATCH_TESTS),
    # --- policies, step mask, sequence cache ---
    Mutant("core/config.h", "return k <= q && (k < sinks || k >= window_begin(q));",
           "return k <= q && (k <= sinks || k >= window_begin(q));",
           "one sink too many is visible", ["step_mask_test.cpp", "batch_scenario_test.cpp", "brute_force_test.cpp"],
           "Batch|StepMask|BruteForce|Scenario|Config"),
    Mutant("core/config.h", "const std::int64_t lo = static_cast<std::int64_t>(q) - window + 1;",
           "const std::int64_t lo = static_cast<std::int64_t>(q) - window;",
           "the window is one key wider", ["step_mask_test.cpp", "batch_scenario_test.cpp", "brute_force_test.cpp"],
           "Batch|StepMask|BruteForce|Scenario|Config"),
    Mutant("batch/step_mask.h", "if (block >= 0 && row < rows) out[row] = 1;", "if (block > 0 && row < rows) out[row] = 1;",
           "the step mask drops keys in block 0", ["step_mask_test.cpp", "batch_scenario_test.cpp"], "StepMask|Batch"),
    Mutant("core/sequence_cache.h", "return n >= 0 && static_cast<std::int64_t>(length_) + n <= capacity_;",
           "return n >= 0 && static_cast<std::int64_t>(length_) + n < capacity_;",
           "a SequenceCache refuses its last position", ["scenario_test.cpp", "brute_force_test.cpp"],
           "Scenario|BruteForce|SequenceCache"),
    # --- byte layers (the thin spots; the pools helper adds their tests) ---
    Mutant("pool/kv_pool.h", "const int i = reverse ? plan.n_write - 1 - n : n;", "const int i = n;",
           "KVPool::write ignores the reverse order an input viewing the pool needs (issue 23)",
           ["kv_pool_test.cpp", "robustness_test.cpp", "fuzz_replay_test.cpp"], "KVPool|Robustness|FuzzCorpus"),
    Mutant("pool/paged_kv_pool.h", "      if (cp.src == cp.dst) continue;", "      if (cp.src != cp.dst) continue;",
           "PagedKVPool::update skips every copy-on-write copy", ["paged_kv_pool_test.cpp"], "PagedKVPool|Paged"),
    Mutant("pool/paged_kv_pool.h", PAGED_COPIES + PAGED_WRITES, PAGED_WRITES + PAGED_COPIES,
           "PagedKVPool::update writes the step's rows before its copy-on-write copies (issue 23)",
           ["paged_kv_pool_test.cpp"], "PagedKVPool|Paged"),
    # --- quantized rows (pool/quantize.h; issue 43 item 6) ---
    # (Not the zero point's lower clamp at -128: an equivalent mutant. The first formula,
    # -128 - lo / scale, is >= -128 as lo <= 0; the second applies only when lo / scale +
    # hi / scale <= 1, and (hi - lo) / scale <= 255, so hi / scale <= 128 and 127 - hi / scale
    # >= -1. 48 million random rows never took it below -128; docs/robustness.md.)
    Mutant("pool/quantize.h", "    q = q < -128.0 ? -128.0 : (q > 127.0 ? 127.0 : q);",
           "    q = q > 127.0 ? 127.0 : q;",
           "an int8 value loses its lower clamp at -128", QUANT_TESTS, QUANT_RE),
    Mutant("pool/quantize.h", "    if (!(p.scale >= FLT_EPSILON)) p.scale = FLT_EPSILON;",
           "    if (!(p.scale > 0.0f)) p.scale = FLT_EPSILON;",
           "the int8 scale's floor is FLT_EPSILON only for a zero range", QUANT_TESTS, QUANT_RE),
    Mutant("pool/quantize.h", "float zp = from_min + from_max > 0.0f ?", "float zp = from_min + from_max >= 0.0f ?",
           "the zero point's tie between its two formulas goes the other way", QUANT_TESTS, QUANT_RE),
    Mutant("pool/quantize.h", "      if (!(scale >= FLT_MIN)) scale = FLT_MIN;", "      if (!(scale > 0.0f)) scale = FLT_MIN;",
           "the fp8 scale's floor is FLT_MIN only for an all-zero row", QUANT_TESTS, QUANT_RE),
    # --- layer kinds (core/chunked_policy.h, core/state_policy.h; issue 43 item 6) ---
    Mutant("core/chunked_policy.h", "append_geometry_runs(p.read, p.n_read, window_begin(position), end);",
           "append_geometry_runs(p.read, p.n_read, window_begin(position) + (position % chunk_ > 0 ? 1 : 0), end);",
           "a chunked step mid-chunk reads from one past its chunk's start", KINDS_TESTS, KINDS_RE),
    Mutant("core/chunked_policy.h", "int needed_floor(int n) const noexcept override { return window_begin(n); }",
           "int needed_floor(int n) const noexcept override { return n; }",
           "a chunked layer's rewind ignores the chunk's earlier keys", KINDS_TESTS, KINDS_RE),
    Mutant("core/state_policy.h", "    if (position > 0) p.read[p.n_read++] = Run{row(position - 1), 1, position - 1};",
           "    if (position > 1) p.read[p.n_read++] = Run{row(position - 1), 1, position - 1};",
           "a state step at position 1 starts from zeros", KINDS_TESTS, KINDS_RE),
    Mutant("core/state_policy.h", "      if (held[s] >= n) held[s] = -1;", "      if (held[s] > n) held[s] = -1;",
           "a truncation to n keeps the state of position n", KINDS_TESTS, KINDS_RE),
    Mutant("core/state_policy.h", "    return n == 0 || held[row(n - 1)] == n - 1;", "    return n == 0 || held[row(n - 1)] >= 0;",
           "a state rewind lands on a slot that holds another position's state", KINDS_TESTS, KINDS_RE),
    Mutant("batch/parts/state_group.h", "      if (p < 0 || p >= upto) continue;", "      if (p < 0) continue;",
           "a fork shares the source's states of positions past upto", ["batch_state_test.cpp"], "BatchState"),
]


def quick_binary(m: Mutant, work: Path, include: Path, timeout: int) -> tuple[bool, str]:
    """Builds the mutant's test files against `include` (the mutated copy of
    cpp/include) into one binary (g++ -O1, two at a time) and runs it: (killed, why)."""
    exe = work / "quick_tests"
    flags = ["g++", "-std=c++17", "-O1", "-fno-exceptions", "-fno-rtti", f"-I{include}", f"-I{ROOT}/tests/cpp",
             f'-DKVCORE_BATCH_FUZZ_CORPUS_DIR="{ROOT}/tests/fuzz/batch_corpus"',
             f'-DKVCORE_FUZZ_CORPUS_DIR="{ROOT}/tests/fuzz/corpus"']
    objs, pending = [], []
    for t in m.tests:
        obj = work / (t + ".o")
        objs.append(str(obj))
        pending.append(subprocess.Popen([*flags, "-c", str(ROOT / "tests/cpp" / t), "-o", str(obj)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        if len(pending) == 2 or t == m.tests[-1]:
            for p in pending:
                _, err = p.communicate()
                if p.returncode != 0:
                    return True, "does not build: " + (err.strip().splitlines() or [""])[0][:120]
            pending = []
    # The suite's operator new counters (tests/cpp/support), as kvcore_tests links them.
    counting = work / "counting_new.o"
    if not counting.exists():
        subprocess.run([*flags, "-c", str(ROOT / "tests/cpp/support/counting_new.cpp"), "-o", str(counting)], check=True)
    link = subprocess.run(["g++", *objs, str(counting), "-lgtest", "-lgtest_main", "-pthread", "-o", str(exe)],
                          capture_output=True, text=True)
    if link.returncode != 0:  # the harness's test list, not the mutant
        raise RuntimeError(f"mutant {m.what!r}: its test files do not link: {link.stderr.strip()[-300:]}")
    try:
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return True, f"timed out after {timeout} s"
    if run.returncode != 0:
        failed = {l.split("]")[1].split(" (")[0].strip() for l in run.stdout.splitlines()
                  if l.startswith("[  FAILED  ]") and "," not in l}
        aborted = "check failed" in run.stderr or run.returncode < 0
        why = ("failed: " + ", ".join(sorted(failed)[:3])) if failed else ""
        if aborted and run.stderr.strip():
            why += ("; " if why else "") + "aborted: " + run.stderr.strip().splitlines()[-1][:100]
        return True, why or f"exit {run.returncode}"
    return False, "every test passed"


def ctest_subset(m: Mutant, build_dir: Path, timeout: int) -> tuple[bool, str]:
    """Builds kvcore_tests in build_dir and runs the mutant's ctest subset: (killed, why)."""
    if not (build_dir / "build.ninja").exists():
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                        "-DKVCORE_BUILD_TESTS=ON", "-DKVCORE_REQUIRE_TESTS=ON", "-DKVCORE_BUILD_BENCH=OFF"],
                       check=True, capture_output=True)
    build = subprocess.run(["cmake", "--build", str(build_dir), "--target", "kvcore_tests"], capture_output=True, text=True)
    if build.returncode != 0:
        return True, "does not build"
    try:
        run = subprocess.run(["ctest", "--test-dir", str(build_dir), "-R", m.regex, "--timeout", str(timeout),
                              "--stop-on-failure", "-j2"], capture_output=True, text=True, timeout=timeout * 4)
    except subprocess.TimeoutExpired:
        return True, "ctest timed out"
    if run.returncode != 0:
        failed = [l.strip() for l in run.stdout.splitlines() if "***Failed" in l or "***Timeout" in l or "Exception" in l]
        return True, ("failed: " + "; ".join(failed[:2])) if failed else "ctest failed"
    return False, "every test passed"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--check", action="store_true", help="check that every mutant applies, and exit")
    ap.add_argument("--only", default="", help="comma-separated mutant numbers (1-based)")
    ap.add_argument("--quick", action="store_true", help="build only each mutant's test files with g++ -O1")
    ap.add_argument("--build-dir", default=str(ROOT / "build/mutate"))
    ap.add_argument("--timeout", type=int, default=300, help="seconds per test run")
    args = ap.parse_args()
    chosen = [int(x) for x in args.only.split(",") if x] or list(range(1, len(MUTANTS) + 1))
    if args.list:
        for i, m in enumerate(MUTANTS, 1):
            print(f"{i:2d}. {m.path}: {m.what}")
        return 0
    for i in chosen:  # every mutant applies exactly once before anything changes
        m = MUTANTS[i - 1]
        count = (ROOT / INC / m.path).read_text().count(m.old)
        if count != 1:
            print(f"mutant {i} ({m.what}): its text occurs {count} times in {m.path}; update the list", file=sys.stderr)
            return 2
    if args.check:
        print(f"{len(chosen)} mutants apply")
        return 0
    work = Path(tempfile.mkdtemp(prefix="kvcore-mutate-"))
    # --quick mutates a private copy of the headers: the tree (and any build
    # reading it meanwhile) never sees a mutant. The default must mutate the
    # tree its build directory reads, and restores it even on SIGTERM.
    include = work / "include"
    shutil.copytree(ROOT / "cpp/include", include)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    killed, survivors = 0, []
    try:
        for i in chosen:
            m = MUTANTS[i - 1]
            path = include / "kvcore" / m.path if args.quick else ROOT / INC / m.path
            original = path.read_text()
            start = time.monotonic()
            try:
                path.write_text(original.replace(m.old, m.new))
                dead, why = (quick_binary(m, work, include, args.timeout) if args.quick
                             else ctest_subset(m, Path(args.build_dir), args.timeout))
            finally:
                path.write_text(original)
            killed += dead
            if not dead:
                survivors.append((i, m))
            print(f"{i:2d}. {'killed  ' if dead else 'SURVIVED'} {m.path}: {m.what} ({why}; {time.monotonic() - start:.0f} s)",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nscore: {killed} / {len(chosen)} killed")
    for i, m in survivors:
        print(f"survivor {i}: {m.path}: {m.what}")
    return 0 if not survivors else 1


if __name__ == "__main__":
    sys.exit(main())
