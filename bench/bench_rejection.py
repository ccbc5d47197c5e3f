"""GPU benchmark of rejection sampling (speculative-decoding verification).

Grid: V in {128256, 151936}, batch in {1, 8, 32, 128}, K in {1, 4, 8} drafts per request,
with and without draft probabilities, fp32 target logits, temperature 0.8 on every request.
Inputs look like a working drafter: 80% of the drafts are a token the target likes
(logit +15, p ~ 0.8) and the draft distribution agrees, the rest are random tokens.
Rows per request in the logits: [K target rows, 1 bonus row].

Implementations
- specops-kernels: specops.spec_decode.rejection_sample on the target rows read in place,
  bonus tokens given. Floor: every target row read once + the draft-prob row of each
  request that has a rejection (the only q rows the verification needs) + q(x) gathers.
- specops-pipeline: the bonus rows sampled by specops.sampling.sample (the Sampler's fused
  kernels on a strided view, no copy) + the kernels. Floor: as above + the bonus rows.
- specops-fused / specops-2pass (no draft probs): the token level of the recovered-token
  race run in every sub-chunk during pass 1, or in the one chosen sub-chunk (sub_chunk_size(V)
  tokens, 4096 at V = 128256) of the rejected row by the finalize kernel (same tokens; the
  default, `fuse_recover=None`, is the latter).
- flashinfer-kernel: flashinfer.sampling.chain_speculative_sampling on probabilities
  prepared outside the timing (draft probs, or one-hot draft probs for n-gram drafts).
- flashinfer-pipeline: what a user runs from logits: softmax(target logits / T) (FlashInfer's
  softmax if available, else torch), the one-hot draft probs when there are no draft
  probs, then chain_speculative_sampling. The draft model's own softmax is left out of
  both pipelines (both take draft probabilities).
- torch: the plain reference (specops.spec_decode.rejection_sample_torch), V = 128256,
  K in {1, 4} only (it draws noise for every row: slow).

Correctness against the torch reference first (every timed shape, and four more shapes with the
fused / two-pass recovery compared), then bench.common.time_us (CUDA graphs). "x fi-pipeline"
is FlashInfer pipeline time / the row's time, as the sampling table's "x <peer>".
Run from the repo root on the GPU machine: python bench/bench_rejection.py
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import Row, copy_bandwidth, floor_us, time_us, write_results  # noqa: E402
from specops import rng  # noqa: E402
from specops.spec_decode import rejection_sample, rejection_sample_torch  # noqa: E402

VOCABS = (128256, 151936)
BATCHES = (1, 8, 32, 128)
KS = (1, 4, 8)
TEMP = 0.8
FAST = dict(iters=30, replays_per_graph=5)
SLOW = dict(graph=False, warmup=1, iters=3)


class Case:
    """One shape's inputs, on the GPU."""

    def __init__(self, vocab, batch, k, with_probs, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        dev = "cuda"
        self.vocab, self.batch, self.k = vocab, batch, k
        n = batch * k
        self.logits = torch.randn(batch * (k + 1), vocab, device=dev, generator=g) * 2
        self.target_rows = (torch.arange(batch, device=dev)[:, None] * (k + 1)
                            + torch.arange(k, device=dev)[None, :]).flatten()
        good = torch.rand(n, device=dev, generator=g) < 0.8
        self.drafts = torch.randint(0, vocab, (n,), device=dev, generator=g)
        self.logits[self.target_rows[good], self.drafts[good]] += 15.0
        self.q = None
        if with_probs:
            ql = torch.randn(n, vocab, device=dev, generator=g) * 2
            ql[torch.arange(n, device=dev)[good], self.drafts[good]] += 15.0
            self.q = torch.softmax(ql, dim=1)
        self.cu = torch.arange(1, batch + 1, device=dev) * k
        self.temperature = torch.full((batch,), TEMP, device=dev)
        self.inv_t = 1.0 / self.temperature
        self.step = torch.tensor([3], dtype=torch.int64, device=dev)
        self.bonus_view = self.logits.view(batch, k + 1, vocab)[:, k]        # strided, no copy
        self.bonus_seeds, self.bonus_pos = rng.row_keys(
            torch.zeros(batch, dtype=torch.int64, device=dev), torch.zeros(batch, dtype=torch.bool, device=dev),
            torch.zeros(batch, dtype=torch.int64, device=dev), 0, self.step[0])
        self.bonus = torch.randint(0, vocab, (batch,), device=dev, generator=g)

    def ours(self, bonus=None, **kw):
        return rejection_sample(self.logits, self.drafts, self.cu, self.k,
                                self.bonus if bonus is None else bonus, target_rows=self.target_rows,
                                draft_probs=self.q, temperature=self.temperature, step=self.step, **kw)

    def ours_pipeline(self):
        from specops.sampling import sample
        bonus = sample(self.bonus_view, self.inv_t, None, None, None, self.bonus_seeds, self.bonus_pos).tokens
        return self.ours(bonus)

    def reference(self):
        return rejection_sample_torch(self.logits, self.drafts, self.cu, self.k, self.bonus,
                                      target_rows=self.target_rows, draft_probs=self.q,
                                      temperature=self.temperature, step=self.step)

    def rejected_requests(self, out) -> int:
        return int(((out >= 0).sum(1) < self.k + 1).sum())


def flashinfer_peers():
    try:
        import flashinfer.sampling as fs
        chain = fs.chain_speculative_sampling
    except Exception as exc:  # noqa: BLE001 - absent or broken peer: its rows are skipped
        print(f"FlashInfer unavailable ({type(exc).__name__}: {exc}): its rows are skipped")
        return None
    softmax = getattr(fs, "softmax", None)
    return chain, softmax


def fi_prepare(case, peers):
    chain, softmax = peers
    b, k, v = case.batch, case.k, case.vocab
    drafts = case.drafts.view(b, k).to(torch.int32)

    def target_probs():
        x = case.logits.view(b * (k + 1), v)
        if softmax is not None:
            try:
                return softmax(x, temperature=TEMP).view(b, k + 1, v), "fi-softmax"
            except Exception:  # noqa: BLE001 - module not prebuilt: torch softmax
                pass
        return torch.softmax(x * (1.0 / TEMP), dim=-1).view(b, k + 1, v), "torch-softmax"

    def draft_probs():
        if case.q is not None:
            return case.q.view(b, k, v)
        return torch.zeros(b, k, v, device="cuda").scatter_(2, drafts.long()[..., None], 1.0)

    tp, how = target_probs()
    dp = draft_probs()

    def kernel():
        res = chain(dp, drafts, tp)
        return res[0] if isinstance(res, tuple) else res

    def pipeline():
        res = chain(draft_probs(), drafts, target_probs()[0])
        return res[0] if isinstance(res, tuple) else res

    return kernel, pipeline, how


def check(case):
    got = case.ours()
    ref = case.reference()
    bad = int((got != ref).any(1).sum())
    if bad:
        raise SystemExit(f"rejection_sample differs from the torch reference on {bad}/{case.batch} requests at "
                         f"V={case.vocab} batch={case.batch} K={case.k} probs={case.q is not None}\n{got}\n{ref}")
    if case.q is None and case.k <= 4:
        for fuse in (True, False):
            assert torch.equal(case.ours(fuse_recover=fuse), got), "fused / two-pass recovery differ"


def main() -> None:
    if not torch.cuda.is_available():
        print("bench_rejection needs CUDA: nothing to do")
        return
    t0 = time.time()
    bw = copy_bandwidth()
    peers = flashinfer_peers()
    for shape in ((128256, 8, 4, True), (128256, 8, 4, False), (151936, 32, 1, False), (151936, 1, 8, True)):
        check(Case(*shape))
    print(f"correctness ok ({time.time() - t0:.1f} s); every timed shape is checked too")
    rows: list[Row] = []
    softmax_note = ""
    for vocab in VOCABS:
        for with_probs in (False, True):
            for k in KS:
                for batch in BATCHES:
                    case = Case(vocab, batch, k, with_probs, seed=batch * 31 + k)
                    check(case)     # the timed inputs themselves, against the torch reference
                    out = case.ours()
                    rejected = case.rejected_requests(out)
                    row_bytes = vocab * 4
                    kernel_bytes = (batch * k * row_bytes + (rejected * row_bytes if with_probs else 0)
                                    + batch * k * 12 + out.numel() * 4)
                    pipe_bytes = kernel_bytes + batch * row_bytes
                    shape = dict(V=vocab, batch=batch, K=k, probs="yes" if with_probs else "no")
                    results = {}

                    def add(impl, us, nbytes):
                        results[impl] = us
                        rows.append(Row("rejection", impl, shape, us, nbytes, floor_us(nbytes)))

                    add("specops-kernels", time_us(case.ours, **FAST), kernel_bytes)
                    add("specops-pipeline", time_us(case.ours_pipeline, **FAST), pipe_bytes)
                    if not with_probs and k <= 4 and vocab == VOCABS[0]:
                        add("specops-fused", time_us(lambda: case.ours(fuse_recover=True), **FAST), kernel_bytes)
                        add("specops-2pass", time_us(lambda: case.ours(fuse_recover=False), **FAST), kernel_bytes)
                    if peers is not None:
                        kernel, pipeline, how = fi_prepare(case, peers)
                        softmax_note = how
                        add("flashinfer-kernel", time_us(kernel, **FAST), pipe_bytes)
                        add("flashinfer-pipeline", time_us(pipeline, **FAST), pipe_bytes)
                    if vocab == VOCABS[0] and k <= 4:
                        add("torch", time_us(case.reference, **SLOW), kernel_bytes)
                    fi = results.get("flashinfer-pipeline")
                    for r in rows[-len(results):]:
                        r.extra["rejected reqs"] = rejected
                        if fi:   # as the sampling table's "x <peer>": > 1 = faster than the peer
                            r.extra["x fi-pipeline"] = fi / r.median_us
                    msg = " ".join(f"{name}={us:.1f}" for name, us in results.items())
                    print(f"V={vocab} probs={with_probs} K={k} B={batch} rejected={rejected}: {msg} µs", flush=True)
    notes = (f"fp32 logits, temperature {TEMP}, 80% good drafts. Floors: specops-kernels = target rows once + "
             "the q row of each rejecting request; pipelines and FlashInfer = that + the bonus rows. "
             f"Copy bandwidth {bw / 1e12:.2f} TB/s. FlashInfer pipeline softmax: {softmax_note or 'n/a'}; "
             "draft-model softmax excluded from both pipelines. x fi-pipeline = FlashInfer pipeline time / "
             "this row's time (> 1: faster than FlashInfer's pipeline). The flashinfer-kernel rows carry the "
             "pipelines' floor, but that kernel is handed probabilities and reads a request's rows only up to "
             "its first rejection, so its ratio to the floor can be below 1. Every shape is checked against the "
             "torch reference before it is timed."
             + ("" if peers is not None else " FlashInfer absent: its rows are missing."))
    print(write_results("rejection", rows, notes=notes))
    print(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
