"""CPU: n-gram speculation vs plain greedy decoding in the engine, on copy-heavy prompts (default model).

For each prompt (repeat a text, edit code, and a plain chat prompt as the control) the specops
engine (``LLMEngine``, batch 1) decodes ``--tokens`` tokens greedily twice: plainly, one token
per step, and with ``spec_method="ngram"`` (K = ``--k``): n-gram drafts verified 1 + K positions
per step by the RejectionSampler's greedy rule, rejected positions rolled back. The outputs must be
identical (checked first; a difference at a near-tie of the reference logits is reported, not
failed); then decode tokens/s of both (best of ``--repeats`` alternating runs), the speedup,
tokens per step and per-position acceptance from the engine's metrics. Target (issue 6): >= 2x
at K = 4 on the copy-heavy prompts.

Run from the repo root: ``python bench/bench_spec_ngram_cpu.py`` (exits 0 with a note when the
default model is not installed). Results: bench/results/spec_ngram_cpu.{md,json,png}, with the
load average of the machine at the time (numbers from a busy machine mean little).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

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


def decode(lm, prompt: list[int], tokens: int, spec: str | None, k: int) -> tuple[list[int], float, dict | None]:
    """One request through the engine: (output ids, decode seconds after the prefill step, spec metrics)."""
    from specops.engine.config import EngineConfig
    from specops.engine.llm_engine import LLMEngine
    from specops.engine.sampling_params import SamplingParams

    eng = LLMEngine(EngineConfig(max_model_len=len(prompt) + tokens + k + 8, max_num_seqs=1,
                                 max_num_batched_tokens=max(2048, len(prompt)), spec_method=spec,
                                 num_spec_tokens=k, spec_log_interval_s=None), loaded=lm)
    eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=tokens))
    out = eng.step()  # the prefill (and the first token)
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        out = eng.step() or out
    dt = time.perf_counter() - t0
    return out[0].token_ids, dt, eng.stats()["spec_decoding"]


def first_difference(lm, prompt: list[int], a: list[int], b: list[int]) -> tuple[int, float]:
    """Index of the first differing token and the reference top-2 logit margin there."""
    from specops.engine.model.reference import reference_forward

    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    logits = reference_forward(lm.model, prompt + a[:i])[-1]
    top = logits.topk(2).values
    return i, float(top[0] - top[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs of each mode; the best is kept")
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

    tok = lm.tokenizer
    load0 = os.getloadavg()
    rows, failed = [], False
    for name in args.prompts.split(","):
        prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPTS[name]}]))
        best = {}
        for _ in range(args.repeats):
            for spec in (None, "ngram"):
                ids, dt, st = decode(lm, prompt, args.tokens, spec, args.k)
                if spec not in best or dt < best[spec][1]:
                    best[spec] = (ids, dt, st)
        (base, t_base, _), (out, t_spec, st) = best[None], best["ngram"]
        same = out == base
        if not same:
            i, margin = first_difference(lm, prompt, base, out)
            tie = margin < 1e-4
            print(f"{name}: outputs differ at token {i} (reference top-2 margin {margin:.2e}"
                  f"{': a near tie' if tie else ''})")
            failed |= not tie
        tps_base, tps_spec = (len(base) - 1) / t_base, (len(out) - 1) / t_spec
        speedup = tps_spec / tps_base
        rates = st["per_position_acceptance_rate"]
        print(f"{name:12s} prompt {len(prompt):4d} tok | plain {tps_base:6.1f} tok/s | ngram K={args.k} "
              f"{tps_spec:6.1f} tok/s | x{speedup:.2f} | {st['mean_acceptance_length']:.2f} tok/step | "
              f"per-pos {', '.join(f'{r:.2f}' for r in rates)} | identical: {same}")
        print(f"   text: {tok.decode(out)[:100]!r}")
        shape = {"prompt": name, "prompt_tokens": len(prompt), "tokens": len(base)}
        rows.append(Row("engine greedy decode", "plain", shape, t_base / (len(base) - 1) * 1e6,
                        extra={"tok/s": tps_base}))
        rows.append(Row("engine greedy decode", f"ngram K={args.k}", shape, t_spec / (len(out) - 1) * 1e6, extra={
            "tok/s": tps_spec, "speedup": speedup, "tokens/step": st["mean_acceptance_length"],
            "acceptance": st["acceptance_rate"], "per-pos": "/".join(f"{r:.2f}" for r in rates),
            "identical": same}))
    load1 = os.getloadavg()
    notes = (f"specops engine (LLMEngine, batch 1), default model (SmolLM2-135M-Instruct Q4_1, fp32 weights), CPU, "
             f"greedy, {args.tokens} tokens, n-gram lookup n=3..1, best of {args.repeats} alternating runs. "
             f"median µs = decode wall time per generated token (after the prefill step). "
             f"torch threads: {torch.get_num_threads()}, {os.cpu_count()} CPUs; load average "
             f"{load0[0]:.2f} at the start, {load1[0]:.2f} at the end (other processes share the cores).")
    path = write_results("spec_ngram_cpu", rows, notes=notes, x_key="none")
    print(notes)
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
