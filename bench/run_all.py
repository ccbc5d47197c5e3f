"""Run every bench/bench_*.py in its own subprocess, with a timeout each and a total budget.

Called by bench/gpu_check.sh on the GPU machine; also usable alone from the repo root:

    python bench/run_all.py                       # every benchmark, 150 s each
    python bench/run_all.py --only ops,sampling   # bench_ops.py and bench_sampling.py
    python bench/run_all.py --budget 300          # stop starting new ones after 300 s

A benchmark that fails or times out is logged and the next one runs. Each benchmark's
output goes to <log-dir>/bench_<name>.log and, prefixed, to stdout. The last lines printed
are a table: name, status (ok / failed rc=N / timeout / skipped: no time left), seconds,
and the result files it wrote under bench/results/. Exit status: 0 if every selected
benchmark passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "bench"


def discover(only: str | None, bench_dir: Path = BENCH_DIR) -> list[Path]:
    """bench/bench_*.py in name order, restricted to `only` (names with or without 'bench_')."""
    files = sorted(bench_dir.glob("bench_*.py"))
    if not only:
        return files
    wanted = {w.strip().removeprefix("bench_").removesuffix(".py") for w in only.split(",") if w.strip()}
    picked = [f for f in files if f.stem.removeprefix("bench_") in wanted]
    unknown = wanted - {f.stem.removeprefix("bench_") for f in picked}
    if unknown:
        print(f"[run_all] no such benchmark: {', '.join(sorted(unknown))} "
              f"(have: {', '.join(f.stem.removeprefix('bench_') for f in files)})", flush=True)
    return picked


def run_one(path: Path, timeout: float, log_dir: Path, env: dict) -> tuple[str, float]:
    """Run one benchmark; stream its output prefixed with its name. Returns (status, seconds)."""
    name = path.stem.removeprefix("bench_")
    log_path = log_dir / f"{path.stem}.log"
    t0 = time.monotonic()
    deadline = t0 + timeout
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, str(path)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        fd = proc.stdout.fileno()
        pending = b""
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                if not sel.select(timeout=min(left, 1.0)):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break  # EOF: the benchmark closed its output (it exited)
                log.write(chunk)
                log.flush()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for ln in lines:
                    print(f"[{name}] {ln.decode(errors='replace')}", flush=True)
            if not timed_out:
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    timed_out = True
        finally:
            if pending:
                print(f"[{name}] {pending.decode(errors='replace')}", flush=True)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # on timeout, or leftovers it started
            except (ProcessLookupError, PermissionError):
                pass
            rc = proc.wait()
            sel.close()
    dt = time.monotonic() - t0
    if timed_out:
        return f"timeout after {timeout:.0f}s", dt
    return ("ok" if rc == 0 else f"failed rc={rc}"), dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=os.environ.get("ONLY_BENCH", ""),
                    help="comma list of benchmark names (ops,sampling,...); default all")
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("BENCH_TIMEOUT", 150)),
                    help="seconds per benchmark")
    ap.add_argument("--budget", type=float, default=float(os.environ.get("BENCH_BUDGET", 1e9)),
                    help="total seconds; no benchmark starts (or runs) past it")
    ap.add_argument("--log-dir", default=str(ROOT / "bench" / "results" / "logs"))
    ap.add_argument("--summary-json", default="")
    ap.add_argument("--bench-dir", default=str(BENCH_DIR), help=argparse.SUPPRESS)
    args = ap.parse_args()

    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TRITON_INTERPRET", None)  # benchmarks time real kernels

    results_dir = Path(env.get("SPECOPS_RESULTS_DIR", ROOT / "bench" / "results"))
    start = time.monotonic()
    wall_start = time.time()
    rows = []
    for path in discover(args.only, Path(args.bench_dir)):
        left = args.budget - (time.monotonic() - start)
        name = path.stem.removeprefix("bench_")
        if left < 10:
            rows.append({"name": name, "status": "skipped: no time left", "seconds": 0.0, "files": []})
            print(f"[run_all] {name}: skipped, {max(left, 0):.0f}s of the budget left", flush=True)
            continue
        timeout = min(args.timeout, left)
        print(f"[run_all] {name}: start (timeout {timeout:.0f}s)", flush=True)
        status, dt = run_one(path, timeout, log_dir, env)
        written = sorted(p.name for p in results_dir.glob("*") if p.is_file() and p.stat().st_mtime >= wall_start
                         and p.suffix in (".md", ".json", ".png"))
        new = [f for f in written if not any(f in r["files"] for r in rows)]
        rows.append({"name": name, "status": status, "seconds": round(dt, 1), "files": new})
        print(f"[run_all] {name}: {status} in {dt:.1f}s", flush=True)

    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(rows, indent=1))
    print("\n[run_all] summary")
    print(f"{'bench':<14} {'status':<24} {'s':>6}  files")
    for r in rows:
        print(f"{r['name']:<14} {r['status']:<24} {r['seconds']:>6.1f}  {' '.join(r['files'])}")
    return 0 if rows and all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
