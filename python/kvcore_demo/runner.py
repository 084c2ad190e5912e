"""What both demos do around their run: a progress bar, one BLAS thread, and the
check, run, report and exit-code sequence of the command line."""

from __future__ import annotations

import contextlib
import ctypes
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import kvcore


class Progress:
    """A one-line progress bar on a stream (a no-op when disabled)."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def update(self, phase: str, done: int, total: int) -> None:
        """Redraws the bar: `phase` and `done` of `total` units."""
        if self.stream is None:
            return
        width = 30
        filled = width * done // max(total, 1)
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r{phase:<12} [{bar}] {done}/{total}")
        self.stream.flush()

    def close(self) -> None:
        """Erases the bar."""
        if self.stream is not None:
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Runs the body with OpenBLAS on one thread, restoring its setting after.

    The demo's matrices are tiny: BLAS threads only add synchronisation, and on a
    busy machine the waits dominate (10x slower prefill). Best effort, the way
    threadpoolctl does it: find the loaded OpenBLAS and call its setter.
    """
    restore: list[tuple[int, Any]] = []
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("openblas", "scipy_openblas"):
            for suffix in ("", "64_"):
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    restore.append((int(get()), put))
                    put(1)
    try:
        yield
    finally:
        for n, put in reversed(restore):
            put(n)


def check_entry(name: str, ok: bool, detail: str) -> dict[str, Any]:
    """One entry of a report's "checks": what was checked, whether it held, the figures."""
    return {"name": name, "ok": ok, "detail": detail}


def format_checks(report: dict[str, Any]) -> list[str]:
    """The report's checks as text lines, one per check, then the result line."""
    lines = [f"  [{'ok' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}" for c in report["checks"]]
    return [*lines, "result: " + ("all checks passed" if report["ok"] else "CHECKS FAILED")]


def run_and_report(
    command: str,
    opts: Any,
    run: Callable[[Any, Progress], dict[str, Any]],
    format_text: Callable[[dict[str, Any]], str],
    *,
    as_json: bool,
    show_progress: bool,
) -> int:
    """Checks `opts` (its check(), and its model_config() when it has one), runs `run(opts, progress)`
    with one BLAS thread and prints its report to stdout, as JSON or as
    `format_text` gives it. Returns the exit code: 0 when the report says ok, 1
    when a check failed or kvcore raised, 2 when the options are refused (the
    reason on stderr, one line after `command`, with a pointer to its --help)."""
    try:
        opts.check()
        if hasattr(opts, "model_config"):
            opts.model_config()
    except ValueError as e:
        print(f"{command}: error: {e}; see {command} --help", file=sys.stderr)
        return 2
    try:
        with single_threaded_blas():
            report = run(opts, Progress(sys.stderr if show_progress else None))
    except ValueError as e:  # includes InvalidArgumentError: options kvcore refuses
        print(f"{command}: error: {e}; see {command} --help", file=sys.stderr)
        return 2
    except kvcore.KVCacheError as e:
        print(f"{command}: FAILED: {e}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if as_json else format_text(report))
    return 0 if report["ok"] else 1
