"""How far apart specops' bitmask apply and xgrammar's CUDA kernel really are, and how far from
the floor, measured in interleaved rounds instead of once.

    XGR_CUDA=1 python bench/exp_bitmask_repeat.py [rounds]   (GPU machine, repo root, after gpu_check.sh's build)

bench_ops times each implementation once per shape, so a 2-5% gap at 2 µs can be the clock of
that moment. Here every round measures the copy bandwidth (the floor's denominator) again,
then times specops and xgrammar-cuda (if XGR_CUDA=1) back to back on the same logits and
grammar mask (p(allowed) = 0.01) at each shape. Per shape: the median over rounds of each
time, of specops / xgrammar and of specops / floor, with the smallest and largest round.
"""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench.common as common  # noqa: E402
from bench.bench_ops import bitmask_min_bytes, make_bitmask, xgrammar_peers  # noqa: E402
from specops.ops import apply_token_bitmask_, apply_token_bitmask_torch  # noqa: E402

# (V, batch, dtype): the small batches where bench_ops put xgrammar-cuda ahead, and the batches
# >= 32 of the 1.3x target
SHAPES = [(128256, 1, torch.bfloat16), (128256, 8, torch.bfloat16), (128256, 32, torch.bfloat16),
          (128256, 1, torch.float32), (128256, 8, torch.float32), (128256, 32, torch.float32),
          (128256, 128, torch.float32), (151936, 32, torch.float32), (151936, 128, torch.float32),
          (128256, 128, torch.bfloat16)]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.3f} [{min(values):.3f}, {max(values):.3f}]"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    torch.manual_seed(0)
    xgr = xgrammar_peers().get("xgrammar-cuda")
    cases = []
    for V, B, dtype in SHAPES:
        logits = torch.randn(B, V, device="cuda").to(dtype)
        bitmask = make_bitmask(B, V, 0.01)
        expected = logits.clone()
        apply_token_bitmask_torch(expected, bitmask)
        for fn in [apply_token_bitmask_] + ([xgr] if xgr else []):
            out = logits.clone()
            fn(out, bitmask)
            assert torch.equal(out, expected), f"wrong at {V=} {B=} {dtype}"
        cases.append((V, B, dtype, logits, bitmask, bitmask_min_bytes(bitmask, V, dtype)))
    times = {i: {"specops": [], "xgr": [], "floor": []} for i in range(len(cases))}
    bws = []
    for _ in range(rounds):
        common._COPY_BW = None               # the floor's bandwidth, measured again each round
        bws.append(common.copy_bandwidth())
        for i, (V, B, dtype, logits, bitmask, nbytes) in enumerate(cases):
            times[i]["floor"].append(nbytes / bws[-1] * 1e6)
            times[i]["specops"].append(common.time_us(lambda: apply_token_bitmask_(logits, bitmask)))
            if xgr:
                times[i]["xgr"].append(common.time_us(lambda: xgr(logits, bitmask)))
    print(f"{torch.cuda.get_device_name()}, {rounds} rounds; copy bandwidth per round (TB/s): "
          + ", ".join(f"{b / 1e12:.2f}" for b in bws))
    print("grammar masks; median [min, max] over rounds")
    print(f"{'V':>6} {'B':>4} {'dtype':>5} | {'specops us':>22} | {'xgrammar-cuda us':>22} | "
          f"{'specops / xgrammar':>22} | {'specops / floor':>22}")
    for i, (V, B, dtype, *_rest) in enumerate(cases):
        t = times[i]
        ratio_x = [a / b for a, b in zip(t["specops"], t["xgr"])] if xgr else []
        ratio_f = [a / f for a, f in zip(t["specops"], t["floor"])]
        na = f"{'-':>22}"
        print(f"{V:>6} {B:>4} {str(dtype)[6:]:>5} | {spread(t['specops']):>22} | "
              f"{spread(t['xgr']) if xgr else na:>22} | {spread(ratio_x) if xgr else na:>22} | {spread(ratio_f):>22}")


if __name__ == "__main__":
    main()
