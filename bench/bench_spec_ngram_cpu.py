"""CPU: n-gram speculation vs plain greedy decoding on copy-heavy prompts (default model).

For each prompt (repeat a text, edit code, continue a list) the default model decodes
``--tokens`` tokens greedily twice over a paged KV cache: one token per forward, then with
n-gram drafts (K = ``--k``) verified 1 + K positions per forward by
``specops.spec_decode.rejection_sample`` (greedy: accept while the draft equals the
argmax; the KV of rejected positions is dropped by rolling num_computed back and is
overwritten next step). The outputs must be identical (checked first); then
tokens/s of both, the speedup, tokens per verifying step and per-position acceptance.
Target (issue 6): >= 2x at K = 4.

Run from the repo root: ``python bench/bench_spec_ngram_cpu.py`` (exits 0 with a note when
the default model is not installed). Results: bench/results/spec_ngram_cpu.{md,json,png}.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace as NS

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import Row, write_results  # noqa: E402

TEXT = ("The old lighthouse stood at the edge of the cliff, its white paint peeling in long strips. "
        "Every evening the keeper climbed the one hundred and twelve steps to light the lamp, "
        "and every morning he climbed them again to put it out. Ships passed far below, "
        "their sailors never knowing his name, but trusting the light all the same.")
CODE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result
'''
PROMPTS = {
    "repeat_text": f"Repeat the following text exactly, word for word:\n\n{TEXT}",
    "edit_code": f"Rename the function to `rolling_mean` and return the full code:\n\n```python\n{CODE}```",
    "plain_chat": "Write a short story about a robot learning to paint.",
}


class PagedSequence:
    """One sequence over a paged cache with an identity block table (batch 1)."""

    def __init__(self, model, max_len: int, block_size: int = 16):
        from specops.engine.model import AttnMetadata

        self.model, self.bs, self.attn_cls = model, block_size, AttnMetadata
        num_blocks = -(-max_len // block_size)
        self.caches = model.make_kv_caches(num_blocks, block_size)
        self.table = list(range(num_blocks))
        self.num_computed = 0

    def forward(self, tokens: list[int]) -> torch.Tensor:  # [len(tokens), vocab] fp32
        attn = self.attn_cls.build(self.caches, [self.num_computed], [len(tokens)], [self.table], self.bs)
        ids = torch.tensor(tokens, dtype=torch.int64)
        pos = torch.arange(self.num_computed, self.num_computed + len(tokens))
        logits = self.model.compute_logits(self.model(ids, pos, attn))
        self.num_computed += len(tokens)
        return logits


def plain_decode(model, prompt: list[int], n: int, eos: set[int]) -> tuple[list[int], float, list[float]]:
    seq = PagedSequence(model, len(prompt) + n + 1)
    logits = seq.forward(prompt)[-1]
    out, margins = [], []
    t0 = time.perf_counter()
    while True:
        top = logits.topk(2).values
        margins.append(float(top[0] - top[1]))
        out.append(int(logits.argmax()))
        if len(out) == n or out[-1] in eos:
            break
        logits = seq.forward([out[-1]])[-1]
    return out, time.perf_counter() - t0, margins


def ngram_decode(model, prompt: list[int], n: int, eos: set[int], k: int, proposer) -> tuple[list[int], float, list]:
    from specops.engine.spec_decode import SpecDecodingStats
    from specops.spec_decode import parse_output, rejection_sample

    seq = PagedSequence(model, len(prompt) + n + k + 2)
    req = NS(request_id="bench", all_token_ids=list(prompt), sampling_params=None)
    out = [int(seq.forward(prompt)[-1].argmax())]
    req.all_token_ids.append(out[-1])
    stats = SpecDecodingStats()
    t0 = time.perf_counter()
    while len(out) < n and out[-1] not in eos:
        kk = min(k, n - len(out) - 1)  # no drafts beyond what may still be emitted
        drafts = proposer.propose([req], kk).token_ids[0] if kk > 0 else []
        logits = seq.forward([out[-1]] + drafts)  # 1 + len(drafts) rows
        if drafts:  # greedy verification by the specops RejectionSampler's op
            kk = len(drafts)
            res = rejection_sample(logits, torch.tensor(drafts), torch.tensor([kk]), kk,
                                   logits[-1:].argmax(dim=-1), target_rows=torch.arange(kk),
                                   is_greedy=True, backend="torch")
            emitted = parse_output(res)[0]
        else:
            emitted = [int(logits[-1].argmax())]
        a = len(emitted) - 1
        seq.num_computed -= len(drafts) - a  # roll back the rejected positions
        if drafts:
            stats.observe([len(drafts)], [a])
        for tok in emitted:
            out.append(tok)
            req.all_token_ids.append(tok)
            if len(out) == n or tok in eos:
                break
    return out, time.perf_counter() - t0, stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompts", default="repeat_text,edit_code,plain_chat")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: steady on a shared machine; 0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        from specops.engine.model import load_model
        lm = load_model(device="cpu", dtype=torch.float32)
    except FileNotFoundError as exc:
        print(f"skipped: {exc}")
        return 0
    from specops.engine.spec_decode import NgramProposer

    tok = lm.tokenizer
    eos = set(tok.eos_token_ids)
    rows, failed = [], False
    for name in args.prompts.split(","):
        prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPTS[name]}]))
        base, t_base, margins = plain_decode(lm.model, prompt, args.tokens, eos)
        spec, t_spec, stats = ngram_decode(lm.model, prompt, args.tokens, eos, args.k, NgramProposer(1, 3))
        same = spec == base
        if not same:
            i = next((j for j, (a, b) in enumerate(zip(spec, base)) if a != b), min(len(spec), len(base)))
            tie = i < len(margins) and margins[i] < 1e-4
            print(f"{name}: outputs differ at token {i} (plain top-2 margin {margins[i] if i < len(margins) else '-'}"
                  f"{': a near tie' if tie else ''})")
            failed |= not tie
        tps_base, tps_spec = len(base) / t_base, len(spec) / t_spec
        speedup = tps_spec / tps_base
        print(f"{name:12s} prompt {len(prompt):4d} tok | plain {tps_base:6.1f} tok/s | ngram K={args.k} "
              f"{tps_spec:6.1f} tok/s | x{speedup:.2f} | {stats.mean_acceptance_length:.2f} tok/step | "
              f"per-pos {', '.join(f'{r:.2f}' for r in stats.per_position_acceptance_rate)} | "
              f"identical: {same}")
        print(f"   text: {tok.decode(spec)[:100]!r}")
        shape = {"prompt": name, "prompt_tokens": len(prompt), "tokens": len(base)}
        rows.append(Row("greedy decode", "plain", shape, t_base / len(base) * 1e6, extra={"tok/s": tps_base}))
        rows.append(Row("greedy decode", f"ngram K={args.k}", shape, t_spec / len(spec) * 1e6, extra={
            "tok/s": tps_spec, "speedup": speedup, "tokens/step": stats.mean_acceptance_length,
            "acceptance": stats.acceptance_rate, "identical": same}))
    notes = (f"Default model (SmolLM2-135M-Instruct Q4_1, fp32 weights), CPU, batch 1, greedy, {args.tokens} tokens, "
             f"n-gram lookup n=3..1. median µs = wall time per generated token (decode only). "
             f"torch threads: {torch.get_num_threads()}.")
    path = write_results("spec_ngram_cpu", rows, notes=notes, x_key="none")
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
