"""Sampling benchmark: temperature + top-k + top-p + min-p + draw, from logits, one token per row.

    python bench/bench_sampling.py        (GPU machine, repo root)

Implementations, same logits, same per-row parameters:

- specops: `specops.sampling.sample` (two fused Triton passes, counter-based noise), with
  unseeded rows (engine seed + step) and with every row seeded ("seeded"; the table's
  seeded/unseeded ratio is of the means over SAMPLING_SEED_DRAWS=4 sets of random streams
  each, since a draw's pivot rounds depend on its noise), as the Sampler
  calls it without processed logprobs (`distribution=False`: tokens only, rows of top-p
  and / or min-p without top-k by pivot rejection), given the kernel options it derives from the metadata
  (`sample_options`: at batch 1 and 2 every filtered row of MIX is a top_k <= 128, so the
  search kernels are left out);
- torch-sort: vLLM's sort-based recipe in plain torch (sort, top-k gather, top-p cumsum,
  softmax, exponential noise, argmax);
- flashinfer: `flashinfer.sampling.top_k_top_p_sampling_from_logits` with per-row top_k /
  top_p tensors on logits already divided by the temperature (its kernel alone: the
  division is not timed; min_p rows run without min_p, greedy rows sample at T = 1);
- plain sampling (no filter, T = 1 on every row): specops vs
  `flashinfer.sampling.sampling_from_logits`;
- top-p alone (0.9 / 0.95, T = 1, fp32 V = 128256 and bf16 V = 151936): specops tokens
  only, and with the thresholds ("specops thresholds", `distribution=True`), vs FlashInfer's
  `softmax` + `top_p_sampling_from_probs`; min-p alone (0.05 / 0.1) the same way vs
  `softmax` + `min_p_sampling_from_probs` (also written to sampling_top_p.* and
  sampling_min_p.*; SAMPLING_TOP_P=1: these rows only, =top_p / =min_p: one of them; SAMPLING_ALONE=0:
  the others only). The thresholds row has its own FlashInfer peer too, softmax + top_p_renorm_probs
  + sampling_from_probs ("flashinfer renorm": the processed distribution, then a token from it).

SAMPLING_RESUME=1 keeps the mixed rows of bench/results/sampling.json (a run cut by its time
limit) and measures only the shapes it lacks (and every other row), so that two device calls
can fill one table.

Logits: "llm" rows are randn * 2 with 32 tokens per row raised by 6..12 (a peaked,
LLM-like distribution: top-p keeps a few tokens); "flat" rows are randn (top-p keeps most
of the vocabulary: specops' exact bisection fallback). Per-row parameters cycle through
MIX. Correctness is checked against the torch reference (specops.sampling.sample_torch,
same noise) on every row before timing; a shape that fails is not timed and the run exits
with 1. Memory floor: the logits read once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import RESULTS_DIR, Row, Timing, copy_bandwidth, floor_us, time_us, write_results  # noqa: E402

VOCABS = (128256, 151936)
BATCHES = (1, 8, 32, 128, 512)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MIX = [  # (temperature, top_k, top_p, min_p) cycled over the rows (batch 1: the first)
    (0.8, 40, 0.95, 0.0),
    (0.7, 50, 1.0, 0.0),
    (1.0, 0, 0.9, 0.0),
    (0.0, 0, 1.0, 0.0),       # greedy
    (1.0, 0, 1.0, 0.05),
    (1.0, 0, 1.0, 0.0),       # plain sampling
    (0.6, 20, 0.8, 0.02),
    (1.0, 500, 0.95, 0.0),
]
FAST = dict(warmup=3, iters=30, replays_per_graph=5)
SLOW = dict(warmup=1, iters=5, replays_per_graph=1)
SEED_DRAWS = int(os.environ.get("SAMPLING_SEED_DRAWS", "4"))   # random-stream sets behind seeded/unseeded


def make_logits(B: int, V: int, dtype: torch.dtype, kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "flat":
        return torch.randn(B, V, device="cuda", generator=g).to(dtype)
    x = torch.randn(B, V, device="cuda", generator=g) * 2.0
    hot = torch.randint(0, V, (B, 32), device="cuda", generator=g)
    x.scatter_add_(1, hot, 6.0 + 6.0 * torch.rand(B, 32, device="cuda", generator=g))
    return x.to(dtype)


def metadata(B: int, V: int, seeded: bool, mix=MIX, draw: int = 0):
    """Per-row parameters cycling through `mix`; `draw` picks another set of random streams
    (seeds 1000 * (draw + 1) + row when seeded, engine step 3 + draw when not)."""
    from specops.sampling import SamplingMetadata
    rows = [mix[i % len(mix)] for i in range(B)]
    return SamplingMetadata.from_params(
        [r[0] for r in rows], vocab_size=V, device="cuda", top_k=[r[1] for r in rows], top_p=[r[2] for r in rows],
        min_p=[r[3] for r in rows], seeds=[1000 * (draw + 1) + i for i in range(B)] if seeded else None,
        positions=[17 + i for i in range(B)], engine_seed=12345, step=3 + draw)


def tokens_only_calls(logits, md, variants: dict, distribution: bool = False) -> dict:
    """{name: call} of `sample(..., distribution=False)` as the 'specops' rows time it (or
    with `distribution=True`, as the 'specops thresholds' rows), with each variant's knobs of
    sample_top_k_top_p_triton added (the experiments' A/B calls)."""
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    base = sample_options(md, md.min_p, None, distribution=distribution)

    def call(knobs):
        opts = dict(base, **knobs)
        return lambda: sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions,
                              backend="triton", distribution=distribution, **opts)
    return {name: call(knobs) for name, knobs in variants.items()}


def experiment_banner(what: str) -> bool:
    """The experiments' first line: the device and `what` they time; False (after saying
    so) without CUDA, where they have nothing to do."""
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to do")
        return False
    print(f"{torch.cuda.get_device_name()}: {what}", flush=True)
    return True


def timed_variants(B: int, V: int, dtype: torch.dtype, mix, seed: int, variants: dict, rounds: int,
                   distribution: bool = False):
    """The experiments' A/B step on 'llm' logits (`make_logits`, `seed`) and unseeded rows of
    `mix`: `tokens_only_calls` of `variants`, each called once and checked bit for bit against
    the first variant's results, then timed (median µs of `rounds` interleaved rounds, FAST).
    Returns (calls, medians, every result = the first's)."""
    from bench.common import interleaved_medians
    logits = make_logits(B, V, dtype, "llm", seed=seed)
    md = metadata(B, V, seeded=False, mix=mix)
    fns = tokens_only_calls(logits, md, variants, distribution)
    res = [fn() for fn in fns.values()]
    same = all(same_result(res[0], r) for r in res)
    return fns, interleaved_medians(fns, rounds, **FAST), same


def same_result(a, b) -> bool:
    """Two SampleResults bit for bit (NaN where NaN; threshold and log_norm may be None)."""
    def eq(x, y):
        return (x is None and y is None) or (torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(),
                                                                                             y.nan_to_num()))
    return torch.equal(a.tokens, b.tokens) and all(eq(getattr(a, f), getattr(b, f))
                                                   for f in ("threshold", "row_max", "log_norm"))


def torch_sort_sample(logits, temperature, top_k, top_p, min_p):
    """vLLM's plain-torch path: softmax min-p, sort-based top-k/top-p, exponential noise."""
    x = logits.float()
    greedy = temperature <= 0
    x = x / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)
    if min_p is not None:
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values, float("-inf"))
    xs, idx = x.sort(dim=-1, descending=False)
    V = x.shape[1]
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, V).long()
        kth = xs.gather(1, (V - k).clamp(0, V - 1).unsqueeze(1))
        xs = xs.masked_fill(xs < kth, float("-inf"))
    if top_p is not None:
        cum = torch.softmax(xs, dim=-1).cumsum(dim=-1)
        mask = cum <= 1 - top_p.unsqueeze(1)
        mask[:, -1] = False
        xs = xs.masked_fill(mask, float("-inf"))
    x = torch.empty_like(xs).scatter_(1, idx, xs)
    probs = torch.softmax(x, dim=-1)
    q = torch.empty_like(probs).exponential_()
    return torch.where(greedy, logits.argmax(dim=-1), (probs / q).argmax(dim=-1))


def flashinfer_sampling():
    try:
        import flashinfer.sampling as fs
        return fs
    except Exception as exc:  # noqa: BLE001 - absent or broken peer: its rows are skipped
        print(f"FlashInfer unavailable ({type(exc).__name__}: {exc}): its rows are skipped", flush=True)
        return None


def check(logits, md, name: str, distribution: bool = False) -> str:
    """specops against the reference (same noise) on every row of the batch, through the
    launch path the timed call takes: "ok", else CheckFailed (the shape gets no row).

    Top-p boundaries are decided in fp32 by the kernel and in fp64 by the reference, so
    thresholds may differ where the kept masses agree to 2e-5; tokens may differ in float
    near-ties of the noise argmax or of a pivot acceptance (at most one row in 64 here).
    `distribution=False` (the Sampler's call without processed logprobs): tokens only.
    """
    from specops.sampling import sample, sample_torch
    from specops.sampling.sampler_torch import scale_logits
    from specops.sampling.topk_topp import sample_options
    n = logits.shape[0]
    args = (logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions)
    a = sample(*args, backend="triton", distribution=distribution, **sample_options(md, md.min_p, None, distribution))
    b = sample_torch(*args, distribution=distribution)
    if not distribution:
        mismatches = int((a.tokens != b.tokens).sum())
        if mismatches > max(1, n // 64):
            raise CheckFailed(f"{name}: specops disagrees with the reference: {mismatches}/{n} tokens differ")
        return "ok"
    bad_mass = 0
    for r0 in range(0, n, 64):     # fp64 copies of 64 rows at a time
        x = scale_logits(logits[r0:r0 + 64], md.inv_temperature[r0:r0 + 64]).double()
        w = torch.exp(x - x.max(dim=-1, keepdim=True).values)
        ma = torch.where(x >= a.threshold[r0:r0 + 64].double().unsqueeze(1), w, 0).sum(-1)
        mb = torch.where(x >= b.threshold[r0:r0 + 64].double().unsqueeze(1), w, 0).sum(-1)
        for i in ((ma - mb).abs() > 2e-5 * w.sum(-1)).nonzero().flatten().tolist():
            bad_mass += not _near_tie(x[i], w[i], md, r0 + i, a.threshold[r0 + i], b.threshold[r0 + i])
    same_invalid = torch.equal(torch.isnan(a.threshold), torch.isnan(b.threshold))
    mismatches = int((a.tokens != b.tokens).sum())
    if bad_mass or not same_invalid or mismatches > max(1, n // 64):
        raise CheckFailed(f"{name}: specops disagrees with the reference: {bad_mass} threshold(s) off, "
                          f"{mismatches}/{n} tokens differ")
    return "ok"


def _near_tie(x, w, md, r: int, ta, tb) -> bool:
    """Row r's two thresholds differ only by float near-ties of the top-p rule (the tests'
    `top_p_near_tie`: every token between them has a mass above within 2e-5 of the target;
    bf16 ties make such a band hold many tokens)."""
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from test_sampling_topk_topp import top_p_near_tie
    x, w = x.cpu(), w.cpu()
    lo, hi = sorted((float(ta), float(tb)))
    k = None if md.top_k is None else int(md.top_k[r])
    mp = None if md.min_p is None else float(md.min_p[r])
    return md.top_p is not None and top_p_near_tie(x, w, w.sum(), lo, hi, float(md.top_p[r]), k, mp, 2e-5)


class CheckFailed(RuntimeError):
    """specops disagreed with the reference on a shape: it is not timed, and the run fails."""


def bench_case(rows, fs, V, B, dname, kind, do_torch=True):
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    dtype = DTYPES[dname]
    logits = make_logits(B, V, dtype, kind, seed=B * 7 + V)
    md_u = metadata(B, V, seeded=False)
    md_s = metadata(B, V, seeded=True)
    tag = f"{kind} V={V} B={B} {dname}"
    _progress(tag, "check")
    status = check(logits, md_u, tag, distribution=False)
    min_bytes = logits.numel() * logits.element_size()
    shape = dict(V=V, batch=B, dtype=dname, logits=kind)
    flo = floor_us(min_bytes)

    def ours(md):   # as the Sampler calls it: with the host's knowledge of the batch's filters, tokens only
        opts = sample_options(md, md.min_p, None, distribution=False)
        return lambda: sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions,
                              backend="triton", distribution=False, **opts)

    _progress(tag, "specops")
    t_u = time_us(ours(md_u), **FAST)
    t_s = time_us(ours(md_s), **FAST)
    # the ratio over SEED_DRAWS sets of random streams each: a tokens-only draw's pivot rounds
    # depend on the noise, so one set's time varies by several % (exp_seeded_draws.py)
    all_u, all_s = [t_u], [t_s]
    for d in range(1, SEED_DRAWS):
        all_u.append(time_us(ours(metadata(B, V, seeded=False, draw=d)), **FAST))
        all_s.append(time_us(ours(metadata(B, V, seeded=True, draw=d)), **FAST))
    extra = {"seeded/unseeded": sum(all_s) / sum(all_u), "check": status}
    peers = {}
    if do_torch:
        _progress(tag, "torch-sort")
        peers["torch-sort"] = time_us(lambda: torch_sort_sample(logits, md_u.temperature, md_u.top_k, md_u.top_p,
                                                                md_u.min_p), **SLOW)
    if fs is not None:
        inv = md_u.inv_temperature
        scaled = (logits.float() * torch.where(inv > 0, inv, torch.ones_like(inv)).unsqueeze(1)).to(dtype)
        k = torch.where(md_u.top_k > 0, md_u.top_k, V).to(torch.int32)
        p = md_u.top_p.contiguous()
        _progress(tag, "flashinfer")
        try:
            fs.top_k_top_p_sampling_from_logits(scaled, k, p)
            peers["flashinfer"] = time_us(lambda: fs.top_k_top_p_sampling_from_logits(scaled, k, p), **FAST)
        except Exception as exc:  # noqa: BLE001
            print(f"flashinfer top_k_top_p_sampling_from_logits failed: {type(exc).__name__}: {exc}", flush=True)
    for name, t in peers.items():
        extra[f"x {name}"] = t / t_u
    rows.append(Row("top-k/top-p/min-p sample", "specops", shape, t_u, min_bytes, flo, extra))
    rows.append(Row("top-k/top-p/min-p sample", "specops seeded", shape, t_s, min_bytes, flo, {}))
    for name, t in peers.items():
        rows.append(Row("top-k/top-p/min-p sample", name, shape, t, min_bytes, flo, {}))
    fi = f" flashinfer {peers['flashinfer']:8.1f}" if "flashinfer" in peers else ""
    to = f" torch {peers['torch-sort']:8.1f}" if "torch-sort" in peers else ""
    print(f"{kind:4s} V={V:6d} B={B:3d} {dname}: specops {t_u:7.1f} us (seeded {t_s:7.1f}, floor {flo:6.2f},"
          f" {t_u / flo:5.2f}x){fi}{to}", flush=True)


TOP_P_MIX = [(1.0, 0, 0.9, 0.0), (1.0, 0, 0.95, 0.0)]
TOP_P_SHAPES = (("fp32", 128256), ("bf16", 151936))   # (dtype, V) of the top-p-alone rows


def bench_top_p(rows, fs, V, B, dname):
    """Top-p alone (0.9 / 0.95 on alternate rows, T = 1), the commonest request, against
    FlashInfer's softmax + top_p_sampling_from_probs (`_bench_one_filter`)."""
    logits = make_logits(B, V, DTYPES[dname], "llm", seed=B * 5 + V)
    md = metadata(B, V, seeded=False, mix=TOP_P_MIX)
    p = None if fs is None else md.top_p.contiguous()
    renorm = None   # the peer of the thresholds row: FlashInfer's processed distribution, then its draw
    if fs is not None:
        renorm = ("softmax + top_p_renorm_probs + sampling_from_probs",
                  lambda: fs.sampling_from_probs(fs.top_p_renorm_probs(fs.softmax(logits), p)))
    _bench_one_filter(rows, "top-p", logits, md, dname, "softmax + top_p_sampling_from_probs",
                      None if fs is None else lambda: fs.top_p_sampling_from_probs(fs.softmax(logits), p),
                      renorm=renorm)


MIN_P_MIX = [(1.0, 0, 1.0, 0.05), (1.0, 0, 1.0, 0.1)]


def bench_min_p(rows, fs, V, B, dname):
    """Min-p alone (0.05 / 0.1 on alternate rows, T = 1; pivot rejection: the plan keeps a first
    candidate that reaches the threshold, one round draws the others), against FlashInfer's
    softmax + min_p_sampling_from_probs (`_bench_one_filter`)."""
    logits = make_logits(B, V, DTYPES[dname], "llm", seed=B * 3 + V)
    md = metadata(B, V, seeded=False, mix=MIN_P_MIX)
    mp = None if fs is None else md.min_p.contiguous()
    _bench_one_filter(rows, "min-p", logits, md, dname, "softmax + min_p_sampling_from_probs",
                      None if fs is None else lambda: fs.min_p_sampling_from_probs(fs.softmax(logits), mp))


def _bench_one_filter(rows, tag, logits, md, dname, peer_name, peer, renorm=None):
    """specops tokens only (the Sampler without processed logprobs: pivot rejection) and with
    the thresholds (`distribution=True`) against `peer` (all timed; op "<tag> sample");
    `renorm` = (name, call): the peer that also gives the processed distribution, timed
    against the thresholds row."""
    from specops.sampling import sample
    from specops.sampling.topk_topp import sample_options
    V, B = logits.shape[1], logits.shape[0]
    _progress(f"{tag} V={V} B={B} {dname}", "check")

    def ours(distribution):
        opts = sample_options(md, md.min_p, None, distribution)
        return lambda: sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p, md.seeds, md.positions,
                              backend="triton", distribution=distribution, **opts)
    _one_peer(rows, f"{tag} sample", tag, logits, md, dname, ours(False), peer_name, peer, with_thresholds=ours(True),
              renorm=renorm)


def _one_peer(rows, op, tag, logits, md, dname, ours, peer_name, peer, with_thresholds=None, renorm=None):
    """Check `ours` (all rows; tokens only), time it and `peer` (FlashInfer, None when absent)
    on the same 'llm' logits, and add their rows to `rows`; `with_thresholds`, the same call
    with distribution=True, is checked and timed too (row "specops thresholds"), and against
    it `renorm` = (name, call), FlashInfer's pipeline that also yields the processed
    distribution (row "flashinfer renorm", column "x flashinfer renorm" of the thresholds row)."""
    V, B = logits.shape[1], logits.shape[0]
    status = check(logits, md, f"{tag} V={V} B={B} {dname}")
    min_bytes = logits.numel() * logits.element_size()
    shape = dict(V=V, batch=B, dtype=dname, logits="llm")
    flo = floor_us(min_bytes)
    t = time_us(ours, **FAST)
    extra = {"check": status}
    if with_thresholds is not None:
        st = check(logits, md, f"{tag} thresholds V={V} B={B} {dname}", distribution=True)
        t_thr = time_us(with_thresholds, **FAST)
        extra["thresholds/tokens"] = t_thr / t
    t_fi = None
    if peer is not None:
        try:
            peer()
            t_fi = time_us(peer, **FAST)
            extra["x flashinfer"] = t_fi / t
        except Exception as exc:  # noqa: BLE001
            print(f"flashinfer {peer_name} failed: {type(exc).__name__}: {exc}", flush=True)
    t_rn = None
    if renorm is not None and with_thresholds is not None:
        try:
            renorm[1]()
            t_rn = time_us(renorm[1], **FAST)
        except Exception as exc:  # noqa: BLE001
            print(f"flashinfer {renorm[0]} failed: {type(exc).__name__}: {exc}", flush=True)
    rows.append(Row(op, "specops", shape, t, min_bytes, flo, extra))
    if with_thresholds is not None:
        rows.append(Row(op, "specops thresholds", shape, t_thr, min_bytes, flo,
                        {"check": st} | ({"x flashinfer": t_fi / t_thr} if t_fi is not None else {})
                        | ({"x flashinfer renorm": t_rn / t_thr} if t_rn is not None else {})))
    if t_fi is not None:
        rows.append(Row(op, "flashinfer", shape, t_fi, min_bytes, flo, {}))
    if t_rn is not None:
        rows.append(Row(op, "flashinfer renorm", shape, t_rn, min_bytes, flo, {}))
    thr = f" (thresholds {t_thr:7.1f})" if with_thresholds is not None else ""
    print(f"{tag} V={V:6d} B={B:3d} {dname}: specops {t:7.1f} us{thr}" + (f" flashinfer {t_fi:7.1f}" if t_fi else ""),
          flush=True)


def _progress(case: str, phase: str) -> None:
    """One line before each phase, so that a run cut by its timeout shows where it stood."""
    if os.environ.get("SAMPLING_PROGRESS", "1") == "1":
        print(f"  [{case}] {phase}...", flush=True)


def bench_plain(rows, fs, V, B, dname):
    from specops.sampling import sample
    logits = make_logits(B, V, DTYPES[dname], "llm", seed=B + 1)
    md = metadata(B, V, seeded=False, mix=[(1.0, 0, 1.0, 0.0)])
    _one_peer(rows, "sample (no filter)", "plain", logits, md, dname,
              lambda: sample(logits, md.inv_temperature, None, None, None, md.seeds, md.positions, backend="triton"),
              "sampling_from_logits", None if fs is None else lambda: fs.sampling_from_logits(logits))


NOTES = ("Per-row parameters cycle through (temperature, top_k, top_p, min_p) = " + ", ".join(map(str, MIX))
         + ". 'llm' logits: randn*2 with 32 tokens per row raised by 6..12; 'flat': randn. FlashInfer runs "
         "top_k_top_p_sampling_from_logits on pre-scaled logits (temperature not timed, no min_p, greedy rows "
         "sampled); x <peer> = peer time / specops time. specops seeded = every row with its own seed; "
         f"seeded/unseeded = the ratio of the mean times over {SEED_DRAWS} sets of random streams each (seeds "
         "1000 * (d + 1) + row against engine step 3 + d; the pivot rounds of a tokens-only draw depend on the "
         "noise: one set's time varies by several %); the specops rows are the first set. "
         "'top-p sample' rows: top_p 0.9 / 0.95 alone at T = 1; FlashInfer runs softmax + "
         "top_p_sampling_from_probs. 'min-p sample' rows: min_p 0.05 / 0.1 alone at T = 1; FlashInfer runs "
         "softmax + min_p_sampling_from_probs. specops rows are the Sampler's call without processed logprobs "
         "(sample(..., distribution=False): tokens only, top-p / min-p without top-k by pivot rejection); 'specops "
         "thresholds' = with the exact thresholds (distribution=True, as for processed logprobs and "
         "rejection targets); its peer 'flashinfer renorm' = softmax + top_p_renorm_probs + sampling_from_probs "
         "(FlashInfer's processed distribution, then a token from it; 'x flashinfer renorm' = its time / the "
         "thresholds row's). Every specops row is checked against the torch reference on all its rows "
         "first.")


def main() -> int:
    if not torch.cuda.is_available():
        print("bench_sampling needs CUDA: skipped")
        return 0
    t0 = time.time()
    copy_bandwidth()
    fs = flashinfer_sampling()
    rows: list[Row] = []
    failed = []
    notes = NOTES
    done = set()   # (function name, V, batch, dtype, logits) already in `rows`
    if os.environ.get("SAMPLING_RESUME") == "1" and (RESULTS_DIR / "sampling.json").exists():
        for r in json.loads((RESULTS_DIR / "sampling.json").read_text())["rows"]:
            if r["op"] != "top-k/top-p/min-p sample":     # only bench_case's shapes are kept (not run again)
                continue
            rows.append(Row(r["op"], r["impl"], r["shape"], Timing.of(r["median_us"], r.get("eager", False)),
                            r["min_bytes"], r["floor_us"], r["extra"]))
            sh = r["shape"]
            done.add(("bench_case", sh["V"], sh["batch"], sh["dtype"], sh["logits"]))
        print(f"resumed {len(rows)} rows of sampling.json", flush=True)
        notes += (f" {len(done)} shapes were kept from an earlier run cut by its time limit (SAMPLING_RESUME=1); "
                  "their floors use that run's copy bandwidth.")

    def guarded(fn, *args, **kw):
        if fn is bench_case and (fn.__name__, *args[2:6]) in done:
            return
        try:
            fn(*args, **kw)
        except Exception as exc:  # noqa: BLE001 - report and go on with the other shapes
            print(f"FAILED {fn.__name__}{args[2:]}: {type(exc).__name__}: {exc}", flush=True)
            failed.append(f"{fn.__name__}{args[2:]}")

    if os.environ.get("SAMPLING_DIAG"):   # which MIX entry is slow: all rows of one kind, per cap
        from specops.sampling import sample
        for kind, V in (("llm", 151936), ("flat", 128256)):
            logits = make_logits(8, V, torch.float32, kind, seed=8 * 7 + V)
            for i, prm in enumerate(MIX):
                md = metadata(8, V, seeded=False, mix=[prm])
                ts = []
                for cap in (1024, 4096):
                    ts.append(time_us(lambda: sample(logits, md.inv_temperature, md.top_k, md.top_p, md.min_p,
                                                     md.seeds, md.positions, backend="triton", cap=cap), **SLOW))
                print(f"diag {kind} V={V} B=8 {prm}: cap1024 {ts[0]:.1f} us, cap4096 {ts[1]:.1f} us", flush=True)
        return 0
    if os.environ.get("SAMPLING_TOP_P"):   # the top-p-alone and min-p-alone rows only, separate files
        only = {"top_p": ("sampling_top_p",), "min_p": ("sampling_min_p",)}.get(os.environ["SAMPLING_TOP_P"])
        for bench, name in ((bench_top_p, "sampling_top_p"), (bench_min_p, "sampling_min_p")):
            if only and name not in only:
                continue
            rows = []
            for dname, V in TOP_P_SHAPES:
                for B in BATCHES:
                    guarded(bench, rows, fs, V, B, dname)
            path = write_results(name, rows, notes=notes)
            print(f"wrote {path} in {time.time() - t0:.0f} s")
        return 1 if failed else 0
    if os.environ.get("SAMPLING_QUICK"):   # a few shapes, no torch-sort rows, separate results file
        for V in VOCABS:   # (written after each vocabulary: a run cut short keeps what it measured)
            for B in (1, 8, 32, 512):
                guarded(bench_case, rows, fs, V, B, "fp32", "llm", do_torch=False)
            write_results("sampling_quick", rows, notes=notes)
        for B in (1, 32):
            guarded(bench_plain, rows, fs, 128256, B, "fp32")
        write_results("sampling_quick", rows, notes=notes)
        guarded(bench_case, rows, fs, 128256, 32, "fp32", "flat", do_torch=False)
        path = write_results("sampling_quick", rows, notes=notes)
        print(f"wrote {path} in {time.time() - t0:.0f} s")
        return 1 if failed else 0
    # Every 'llm' shape first (written after each vocabulary and dtype), then the flat and plain
    # rows: a run cut by its share keeps the shapes of the targets. Whole run on the H200:
    # 273 s (2026-11-30); cut at 293 s in another run, just before bf16 V=151936, when it came last.
    for dname in DTYPES:
        for V in VOCABS:
            for B in BATCHES:
                guarded(bench_case, rows, fs, V, B, dname, "llm", do_torch=(dname == "fp32"))
            write_results("sampling", rows, notes=notes)
    for B in (1, 32, 512):
        guarded(bench_case, rows, fs, 128256, B, "fp32", "flat", do_torch=False)
    for dname in DTYPES:
        for B in (1, 32, 512):
            guarded(bench_plain, rows, fs, 128256, B, dname)
    write_results("sampling", rows, notes=notes)
    # the rows of one filter alone: in sampling.* and in their own files (as SAMPLING_TOP_P=1)
    # (SAMPLING_ALONE=0 leaves them out: the mixed rows alone fit one 600 s device call)
    alone = {"sampling_top_p": [], "sampling_min_p": []}
    for dname, V in TOP_P_SHAPES if os.environ.get("SAMPLING_ALONE", "1") == "1" else ():
        for B in BATCHES:
            guarded(bench_top_p, alone["sampling_top_p"], fs, V, B, dname)
            guarded(bench_min_p, alone["sampling_min_p"], fs, V, B, dname)
        for name, its_rows in alone.items():
            if its_rows:
                write_results(name, its_rows, notes=notes)
    rows += alone["sampling_top_p"] + alone["sampling_min_p"]
    path = write_results("sampling", rows, notes=notes)
    print(f"wrote {path} in {time.time() - t0:.0f} s")
    if failed:
        print(f"{len(failed)} shape(s) failed (no row in the table): {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
