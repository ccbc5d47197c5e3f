"""Design study for top-p alone (CPU, torch): exact top-p draws by pivot rejection, no threshold.

    python bench/exp_topp_rejection_cpu.py

Session 29 measured top-p alone slower than FlashInfer from batch 8 (bench/results/sampling.md,
"top-p sample" rows): the exact threshold takes two refine rounds and a collect that races
noise over every kept token. A draw that needs no threshold:

    pivot = -inf
    repeat: draw t from exp(x - m) restricted to x > pivot (an exponential race: specops'
            two-level draw, with the restriction); keep t if the mass strictly above x_t is
            below p * Z (then x_t >= tau: t is in the top-p set); else pivot = x_t.

A rejected t has x_t < tau, so every token at or below it is outside the set too: the next
draw, restricted to x > x_t, is still the full distribution conditioned on a superset of the
set, and the accepted token is drawn from the top-p distribution exactly (rejection sampling).
On the GPU each round is one pass over a row (the verification of this round's token fused
with the restricted sub-chunk masses of the next round's draw), so the cost is the number of
rounds. This script checks the exactness statistically on a small vocabulary and counts the
rounds on the benchmark's logits. It writes nothing; its output is the log.
"""
import math

import torch


def llm_logits(B: int, V: int, g: torch.Generator) -> torch.Tensor:
    """bench_sampling's 'llm' rows (randn * 2, 32 tokens raised by 6..12), on the CPU."""
    x = torch.randn(B, V, generator=g, dtype=torch.float64) * 2.0
    hot = torch.randint(0, V, (B, 32), generator=g)
    x.scatter_add_(1, hot, 6.0 + 6.0 * torch.rand(B, 32, generator=g, dtype=torch.float64))
    return x


def top_p_set(x: torch.Tensor, p: float) -> torch.Tensor:
    """[B, V] bool: the exact top-p set (ties at the threshold kept), by sorting."""
    s, _ = x.sort(dim=1, descending=True)
    w = torch.exp(s - s[:, :1])
    cum_excl = torch.cumsum(w, 1) - w
    n_keep = (cum_excl < p * w.sum(1, keepdim=True)).sum(1)
    tau = s.gather(1, (n_keep - 1).unsqueeze(1))
    return x >= tau


def pivot_draw(x: torch.Tensor, p: float, g: torch.Generator, max_rounds: int = 64):
    """One pivot-rejection draw per row: (tokens [B], rounds [B])."""
    B, V = x.shape
    w = torch.exp(x - x.max(dim=1, keepdim=True).values)
    target = p * w.sum(1)
    pivot = torch.full((B,), -math.inf, dtype=x.dtype)
    tok = torch.full((B,), -1, dtype=torch.int64)
    rounds = torch.zeros(B, dtype=torch.int64)
    live = torch.ones(B, dtype=torch.bool)
    for _ in range(max_rounds):
        if not bool(live.any()):
            break
        e = -torch.log1p(-torch.rand(B, V, generator=g, dtype=torch.float64))   # Exp(1) noise of this round
        score = torch.where(x > pivot[:, None], w / e, -1.0)
        t = score.argmax(1)
        xt = x.gather(1, t[:, None]).squeeze(1)
        above = torch.where(x > xt[:, None], w, 0.0).sum(1)
        ok = above < target
        rounds += live.to(torch.int64)
        tok = torch.where(live & ok, t, tok)
        pivot = torch.where(live & ~ok, xt, pivot)
        live &= ~ok
    return tok, rounds


def exactness(g: torch.Generator) -> None:
    V, draws = 40, 200_000
    for p in (0.5, 0.9, 0.95):
        x = torch.randn(1, V, generator=g, dtype=torch.float64) * 1.5
        x[0, :5] = x[0, 5]            # ties at several values
        keep = top_p_set(x, p)[0]
        w = torch.where(keep, torch.exp(x[0] - x[0].max()), 0.0)
        target = w / w.sum()
        tok, _ = pivot_draw(x.expand(draws, V).contiguous(), p, g)
        freq = torch.bincount(tok, minlength=V).double() / draws
        tv = 0.5 * (freq - target).abs().sum().item()
        outside = int(freq[~keep].gt(0).sum())
        # E[TV] of an exact sampler ~ sum sqrt(q (1 - q) / n) / 2 * sqrt(2 / pi)
        bound = 4 * 0.5 * (target * (1 - target) / draws).sqrt().sum().item()
        print(f"exactness V={V} p={p}: kept {int(keep.sum())}, TV {tv:.5f} (4x the exact sampler's "
              f"expected {bound:.5f}), tokens outside the set drawn: {outside}", flush=True)
        assert outside == 0 and tv <= bound


def rounds_on_bench_logits(g: torch.Generator) -> None:
    B, V = 64, 128256
    for kind in ("llm", "flat"):
        x = llm_logits(B, V, g) if kind == "llm" else torch.randn(B, V, generator=g, dtype=torch.float64)
        for p in (0.8, 0.9, 0.95, 0.99):
            kept = top_p_set(x, p).sum(1).double()
            _, r = pivot_draw(x, p, g)
            q = torch.quantile(r.double(), torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
            print(f"{kind:4s} V={V} B={B} top_p={p}: kept tokens median {kept.median().item():8.0f}; rounds mean "
                  f"{r.double().mean().item():.3f}, median/p90/p99 {q[0]:.0f}/{q[1]:.0f}/{q[2]:.0f}, max {int(r.max())}",
                  flush=True)


def main() -> None:
    g = torch.Generator().manual_seed(29)
    exactness(g)
    rounds_on_bench_logits(g)


if __name__ == "__main__":
    main()
