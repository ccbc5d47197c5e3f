"""Shared benchmark helpers: device timing, the memory floor, and result files.

Every GPU benchmark checks correctness first, then times with CUDA-graph replay
(falling back to CUDA events on an eager loop when a callable cannot be captured),
and reports median µs, effective GB/s and the ratio to the memory floor
(minimum bytes / measured device-to-device copy bandwidth), with the same numbers
for each peer measured in the same run.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

RESULTS_DIR = Path(os.environ.get("SPECOPS_RESULTS_DIR", Path(__file__).resolve().parent / "results"))


@dataclass
class Row:
    """One timed (op, implementation, shape) point."""

    op: str
    impl: str
    shape: dict
    median_us: float
    min_bytes: int = 0
    floor_us: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.min_bytes / (self.median_us * 1e-6) / 1e9 if self.median_us > 0 else 0.0

    @property
    def floor_ratio(self) -> float:
        return self.median_us / self.floor_us if self.floor_us > 0 else float("nan")


def env_info() -> dict:
    """GPU name and versions, recorded with every result file."""
    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
    }
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    from importlib import metadata
    for name, dist in (("flashinfer", "flashinfer-python"), ("xgrammar", "xgrammar")):
        try:
            info[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[name] = getattr(__import__(name), "__version__", None) if _importable(name) else None
    return info


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except Exception:  # noqa: BLE001 - a peer that is absent or broken is just not recorded
        return False


_COPY_BW: float | None = None


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read + bytes written)."""
    global _COPY_BW
    if _COPY_BW is None:
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        us = time_us(lambda: dst.copy_(src), graph=False, warmup=5, iters=30)
        _COPY_BW = nbytes / (us * 1e-6)
    return _COPY_BW


def floor_us(min_bytes: int) -> float:
    """Time to move `min_bytes` at the measured copy bandwidth, in µs."""
    return min_bytes / copy_bandwidth() * 1e6


class Timing(float):
    """A median in µs (a float) that knows whether it was timed eagerly (CUDA events on a
    loop of calls, launch gaps included) instead of by CUDA-graph replay."""

    eager: bool = False

    @classmethod
    def of(cls, us: float, eager: bool) -> "Timing":
        t = cls(us)
        t.eager = eager
        return t


def is_eager(us) -> bool:
    """Was this time_us result measured eagerly (capture failed, or graph=False)?"""
    return bool(getattr(us, "eager", False))


def time_us(fn: Callable[[], object], graph: bool = True, warmup: int = 10, iters: int = 100,
            replays_per_graph: int = 10) -> Timing:
    """Median device time of one call of `fn`, in µs.

    With graph=True, `replays_per_graph` calls are captured in one CUDA graph and the
    graph is replayed `iters` times (launch gaps shrink to what a serving engine sees);
    if capture fails, times an eager loop with CUDA events instead, says so on stdout and
    marks the result (`is_eager`): write_results flags such rows in the table.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if graph:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(replays_per_graph):
                    fn()
            return Timing.of(_median_events(g.replay, iters) / replays_per_graph, eager=False)
        except Exception as exc:  # noqa: BLE001 - not capturable: fall back to eager timing
            torch.cuda.synchronize()
            print(f"time_us: CUDA-graph capture failed ({type(exc).__name__}: {exc}); timed eagerly", flush=True)
    return Timing.of(_median_events(fn, iters), eager=True)


def interleaved_medians(fns: dict, rounds: int, **timing) -> dict:
    """Median µs of each of `fns` (name -> call) over `rounds` rounds that time every call once
    (time_us with `timing`) in turn, so that drift in the device's clocks hits them alike."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_us(fn, **timing))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def profiled(call: Callable[[], object], n: int, warmup: int = 1):
    """torch.profiler of `n` calls of `call()` (CUDA activity), after `warmup` calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    return prof


def kernel_us(call: Callable[[], object], n: int = 10) -> dict[str, float]:
    """Average device µs per call of each kernel of `call()` (torch.profiler, after one warm-up call)."""
    out = {}
    for e in profiled(call, n).key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if total > 0 and "kernel" in e.key and "Launch" not in e.key:   # Triton's by name, torch's by template
            out[e.key] = out.get(e.key, 0.0) + total / n
    return out


def kernel_timeline(call: Callable[[], object], warmup: int = 3) -> list[tuple[str, float, float, int]]:
    """The kernels of one `call()` replayed from a CUDA graph, in start order: (name, start µs
    from the first kernel's start, duration µs, stream), from torch.profiler's kineto events.
    One replay (after `warmup` eager calls and a warm-up replay): launch gaps are the graph's,
    side streams show as their own stream ids."""
    from torch.profiler import ProfilerActivity, profile

    side = torch.cuda.Stream()                      # warm-up off the default stream, as time_us
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.profiler.kineto_results.events()
               if e.device_type() == torch.autograd.DeviceType.CUDA and "memcpy" not in e.name().lower()
               and "memset" not in e.name().lower()]
    kernels.sort(key=lambda e: e.start_ns())
    t0 = kernels[0].start_ns() if kernels else 0
    return [(e.name().split("(")[0], (e.start_ns() - t0) / 1e3, e.duration_ns() / 1e3, e.device_resource_id())
            for e in kernels]


def kernel_line(call: Callable[[], object]) -> str:
    """`kernel_us(call)` as one printable line: 'name us, name us, ...' (names cut at 22)."""
    return ", ".join(f"{k.split('(')[0][:22]} {v:.1f}" for k, v in kernel_us(call).items())


def _median_events(fn: Callable[[], object], iters: int) -> float:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def write_results(name: str, rows: list[Row], notes: str = "", x_key: str = "batch") -> Path:
    """Write bench/results/<name>.md (table), .json (raw) and .png (µs against x_key)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    info = env_info()
    bw = _COPY_BW
    header = [f"# {name}", "", "| " + " | ".join(f"{k}: {v}" for k, v in info.items()) + " |", ""]
    if bw:
        header.append(f"Measured copy bandwidth: {bw / 1e12:.2f} TB/s (floor = min bytes / this).")
        header.append("")
    if notes:
        header += [notes, ""]
    if any(is_eager(r.median_us) for r in rows):
        header += ["A median marked (eager) was timed with CUDA events on an eager loop (graph capture "
                   "failed or was not asked for): launch gaps included.", ""]
    shape_keys = sorted({k for r in rows for k in r.shape})
    extra_keys = sorted({k for r in rows for k in r.extra})
    cols = ["op", "impl", *shape_keys, "median µs", "GB/s", "floor µs", "x floor", *extra_keys]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        vals = [r.op, r.impl, *[str(r.shape.get(k, "")) for k in shape_keys],
                f"{r.median_us:.2f}" + (" (eager)" if is_eager(r.median_us) else ""), f"{r.gbps:.0f}", f"{r.floor_us:.2f}", f"{r.floor_ratio:.2f}",
                *[_fmt(r.extra.get(k, "")) for k in extra_keys]]
        lines.append("| " + " | ".join(vals) + " |")
    md = RESULTS_DIR / f"{name}.md"
    md.write_text("\n".join(header + lines) + "\n")
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(
        {"env": info, "copy_bandwidth": bw,
         "rows": [asdict(r) | {"median_us": float(r.median_us), "eager": is_eager(r.median_us), "gbps": r.gbps,
                               "floor_ratio": r.floor_ratio} for r in rows]}, indent=1))
    _plot(name, rows, x_key)
    return md


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _plot(name: str, rows: list[Row], x_key: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if x_key not in r.shape:
            continue
        rest = tuple(sorted((k, v) for k, v in r.shape.items() if k != x_key))
        groups.setdefault((r.op, rest), []).append(r)
    if not groups:
        return
    panels = sorted({k for k in groups})
    n = len({(op, rest) for op, rest in panels})
    fig, axes = plt.subplots(n, 1, figsize=(7, 3.2 * n), squeeze=False)
    for ax, key in zip(axes[:, 0], panels):
        by_impl: dict[str, list[Row]] = {}
        for r in groups[key]:
            by_impl.setdefault(r.impl, []).append(r)
        for impl, rs in sorted(by_impl.items()):
            rs.sort(key=lambda r: r.shape[x_key])
            ax.plot([r.shape[x_key] for r in rs], [r.median_us for r in rs], marker="o", label=impl)
        floor = sorted({(r.shape[x_key], r.floor_us) for r in groups[key] if r.floor_us > 0})
        if floor:
            ax.plot([x for x, _ in floor], [f for _, f in floor], "k--", label="memory floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(x_key)
        ax.set_ylabel("median µs")
        ax.set_title(f"{key[0]} " + " ".join(f"{k}={v}" for k, v in key[1]), fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS_DIR / f"{name}.png", dpi=90)
    plt.close(fig)
