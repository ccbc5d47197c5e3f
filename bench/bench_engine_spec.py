"""GPU: engine tokens/s with and without speculative decoding, at batch 1, 8, 32, 128.

Models (random weights; the default GGUF model is not on the GPU machine): a target with
SmolLM2-135M shapes (30 layers, hidden 576, 9 heads / 3 KV heads, vocab 49152, tied head) and a
draft with the same vocabulary (4 layers, hidden 256). Prompts are copy-heavy: a random phrase
repeated. Modes per batch size:

- plain: one token per step;
- ngram: prompt-lookup drafts (K = 4), verified by the RejectionSampler (acceptance is whatever
  the random target's greedy output gives);
- draft: the draft model's K = 4 drafts (its own KV cache, no host sync inside its loop);
- ngram@0.7 and draft@0.7: synthetic acceptance (each draft accepted with probability 0.7 given
  the previous one was), to time the engine at a realistic acceptance rate with random weights.

Correctness first: greedy tokens of the ngram and draft modes against plain decoding (bf16 GEMMs
of 1 + K rows and of 1 row may round differently, so near-ties can flip: the share of identical
requests is reported; exactness is proven by the CPU tests). Each row: decode tokens/s, step
time, tokens per step, per-position acceptance; then, per proposer, the smallest batch size at
which speculation stops paying. Total GPU time well under 90 s (a budget check skips what is
left when it runs long).

Run from the repo root on the GPU machine: ``python bench/bench_engine_spec.py``
(``--smoke`` runs tiny shapes on any device, to check the script itself).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import Row, write_results  # noqa: E402

BATCHES = (1, 8, 32, 128)
K = 4
PROMPT_LEN = 64
DECODE_TOKENS = 48
SYNTHETIC_RATE = 0.7
BUDGET_S = 75.0


def smollm2_config(smoke: bool = False):
    from specops.engine.model.config import ModelConfig

    if smoke:
        return ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                           num_kv_heads=1, head_dim=32, rope_theta=100000.0, rms_norm_eps=1e-5,
                           max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=[2])
    return ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                       num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
                       max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=[2])


def draft_config(target):
    from dataclasses import replace

    if target.num_layers <= 2:  # smoke
        return replace(target, num_layers=1)
    return replace(target, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4, num_kv_heads=1)


def prompts(batch: int, vocab: int) -> list[list[int]]:
    rng = random.Random(batch)
    out = []
    for _ in range(batch):
        phrase = [rng.randrange(10, vocab) for _ in range(16)]
        out.append((phrase * (PROMPT_LEN // 16 + 1))[:PROMPT_LEN])
    return out


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(target, draft, batch: int, mode: str, decode_tokens: int) -> dict:
    """Prefill `batch` prompts in one step, then time the decode steps until every request is done."""
    from specops.engine.config import EngineConfig
    from specops.engine.llm_engine import LLMEngine
    from specops.engine.sampling_params import SamplingParams

    spec = mode.split("@")[0]
    cfg = dict(max_num_seqs=batch, max_num_batched_tokens=max(2048, batch * PROMPT_LEN),
               max_model_len=PROMPT_LEN + decode_tokens + K + 8, block_size=16, spec_log_interval_s=None)
    cfg["num_kv_blocks"] = batch * (-(-cfg["max_model_len"] // 16)) + 1
    if spec != "plain":
        cfg.update(spec_method=spec, num_spec_tokens=K)
    if "@" in mode:
        cfg["spec_synthetic_acceptance"] = float(mode.split("@")[1])
    eng = LLMEngine(EngineConfig(**cfg), loaded=target, draft_loaded=draft if spec == "draft" else None)
    ids = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=decode_tokens, ignore_eos=True))
           for p in prompts(batch, target.config.vocab_size)]
    done = {}
    for out in eng.step():  # prefill: every prompt fits the budget
        done[out.request_id] = out
    _sync()
    steps0, t0 = eng.num_steps, time.perf_counter()
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    _sync()
    dt = time.perf_counter() - t0
    steps = eng.num_steps - steps0
    tokens = sum(len(done[i].token_ids) for i in ids) - batch  # the prefill step's tokens are not timed
    st = eng.stats()["spec_decoding"] or {}
    res = {"tokens_per_s": tokens / dt, "step_us": dt / max(steps, 1) * 1e6, "tokens_per_step": tokens / max(steps, 1),
           "per_pos": st.get("per_position_acceptance_rate", []),
           "mean_acceptance_length": st.get("mean_acceptance_length", 1.0), "outputs": [done[i].token_ids for i in ids]}
    del eng
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device (checks the script)")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.smoke:
        print("bench_engine_spec: no CUDA device; nothing to time (use --smoke to check the script on CPU)")
        return 0
    from specops.engine.model.random_checkpoint import random_model

    t_start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tc = smollm2_config(args.smoke)
    target = random_model(tc, device=device, seed=0)
    draft = random_model(draft_config(tc), device=device, seed=1)
    backend = getattr(target.model, "attn_backend_name", "?")
    print(f"target {tc.num_layers}L/{tc.hidden_size} vocab {tc.vocab_size}, draft {draft.config.num_layers}L/"
          f"{draft.config.hidden_size}; {device}, {target.model.dtype}, attention {backend} "
          f"(setup {time.perf_counter() - t_start:.1f} s)")
    decode_tokens = 12 if args.smoke else DECODE_TOKENS
    batches = (1, 4) if args.smoke else BATCHES
    modes = ("plain", "ngram", f"ngram@{SYNTHETIC_RATE}", "draft", f"draft@{SYNTHETIC_RATE}")

    # Correctness (and a first warm-up: Triton compilation, FlashInfer, the allocator).
    check = {}
    for mode in modes:
        try:
            check[mode] = run(target, draft, 8 if not args.smoke else 4, mode, 8)["outputs"]
        except Exception as exc:  # e.g. an attention backend that rejects these shapes: retry with torch
            if backend == "torch":
                raise
            print(f"{mode} failed with {backend} attention ({type(exc).__name__}: {exc}); using torch attention")
            backend = "torch"
            target.model.set_attn_backend("torch")
            draft.model.set_attn_backend("torch")
            check[mode] = run(target, draft, 8 if not args.smoke else 4, mode, 8)["outputs"]
    notes_check = []
    for mode in ("ngram", "draft"):
        same = sum(a == b for a, b in zip(check[mode], check["plain"]))
        line = f"greedy {mode} vs plain: {same}/{len(check['plain'])} requests identical"
        print(line + ("" if same == len(check["plain"]) else " (bf16 near-ties between 1+K-row and 1-row GEMMs)"))
        notes_check.append(line)

    rows, results, skipped = [], {}, []
    for batch in batches:
        for mode in modes:
            if time.perf_counter() - t_start > BUDGET_S:
                skipped.append(f"{mode}@batch{batch}")
                continue
            try:
                run(target, draft, batch, mode, 4)  # warm-up at this batch size (Triton specialises on sizes)
                r = run(target, draft, batch, mode, decode_tokens)
            except Exception as exc:  # keep going: one failed point must not cost the whole GPU run
                print(f"  {mode:10s} batch {batch:4d}: FAILED {type(exc).__name__}: {exc}")
                continue
            results[batch, mode] = r
            speed = r["tokens_per_s"] / results[batch, "plain"]["tokens_per_s"] if (batch, "plain") in results else 0
            per_pos = "/".join(f"{x:.2f}" for x in r["per_pos"])
            print(f"  {mode:10s} batch {batch:4d}: {r['tokens_per_s']:9.0f} tok/s (x{speed:.2f}), step "
                  f"{r['step_us']:8.0f} us, {r['tokens_per_step'] / batch:.2f} tok/step/req"
                  f"{', per-pos ' + per_pos if per_pos else ''}")
            rows.append(Row(op="engine decode", impl=mode, shape={"batch": batch, "K": 0 if mode == "plain" else K},
                            median_us=r["step_us"],
                            extra={"tokens_per_s": round(r["tokens_per_s"], 1), "speedup": round(speed, 3),
                                   "tokens_per_step": round(r["tokens_per_step"] / batch, 3),
                                   "mean_acceptance_length": round(r["mean_acceptance_length"], 3),
                                   "per_pos_acceptance": per_pos or "-"}))
    breakeven = []
    for mode in modes[1:]:
        losing = [b for b in batches if (b, mode) in results and (b, "plain") in results
                  and results[b, mode]["tokens_per_s"] < results[b, "plain"]["tokens_per_s"]]
        line = f"{mode}: " + (f"slower than plain from batch {losing[0]}" if losing
                              else "faster at every batch measured")
        print(line)
        breakeven.append(line)
    notes = (f"specops engine (eager, {backend} attention, {target.model.dtype}), greedy, random target with "
             f"SmolLM2-135M shapes and a 4-layer random draft sharing its vocabulary; prompts {PROMPT_LEN} tokens "
             f"(a phrase repeated), {decode_tokens} decoded tokens per request, K = {K}. median µs = decode step "
             f"time; tokens_per_step = tokens per request per step. '@{SYNTHETIC_RATE}' = synthetic acceptance. "
             f"Correctness: {'; '.join(notes_check)}. Speculation stops paying: {'; '.join(breakeven)}.")
    if skipped:
        notes += f" Skipped (time budget): {', '.join(skipped)}."
    path = write_results("engine_spec" if not args.smoke else "engine_spec_smoke", rows, notes=notes)
    print(f"wrote {path} ({time.perf_counter() - t_start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
