// Penalties in one pass over the logits: read logits + prompt mask + output counts (or the
// output mask), write logits. Rows whose penalties are neutral are skipped entirely, and the
// prompt mask is not read for rows without a repetition penalty.
#pragma once
#include "common/penalty_math.h"
#include "cuda/device_utils.cuh"

namespace specops {

inline LaunchConfig penalty_config(const PenaltyParams& p, FloatType dtype, int num_sms) {
  const int esz = float_size(dtype), vec = 16 / esz;
  const bool fused = p.output_counts != nullptr;
  const bool vectorised =
      p.vocab % vec == 0 && aligned(p.logits, p.logits_stride * esz, 16) &&
      aligned(p.prompt_mask, p.prompt_stride, vec) &&
      (fused ? aligned(p.output_counts, p.counts_stride * 4, 16) : aligned(p.output_mask, p.output_stride, vec));
  return row_chunk_config(p.rows, p.vocab, vectorised ? vec : 1, num_sms);
}

// FUSED: repetition + frequency + presence from output_counts; else repetition from output_mask.
template <typename T, int VEC, int UNROLL, bool FUSED>
SPECOPS_HD void penalty_thread(const PenaltyParams& p, const Coord& c) {
  const int64_t g0 = c.bx * c.bdim * UNROLL + c.tx;
  for (int64_t r = c.by; r < p.rows; r += c.gy) {
    const float rep = p.repetition[r];
    const float freq = FUSED ? p.frequency[r] : 0.0f;
    const float pres = FUSED ? p.presence[r] : 0.0f;
    if (penalties_neutral(rep, freq, pres)) continue;
    const bool read_prompt = rep != 1.0f;
    T* lrow = static_cast<T*>(p.logits) + r * p.logits_stride;
    const uint8_t* prow = reinterpret_cast<const uint8_t*>(p.prompt_mask) + r * p.prompt_stride;
    const int32_t* crow = FUSED ? p.output_counts + r * p.counts_stride : nullptr;
    const uint8_t* orow = FUSED ? nullptr : reinterpret_cast<const uint8_t*>(p.output_mask) + r * p.output_stride;

    Vec<T, VEC> logit[UNROLL];
    Vec<uint8_t, VEC> prompt[UNROLL];
    Vec<int32_t, VEC> count[UNROLL];  // FUSED: counts; else 0/1 from the output mask
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t e = (g0 + u * c.bdim) * VEC;
      if (e >= p.vocab) continue;  // VEC > 1 only when VEC divides vocab
      logit[u] = load_vec<T, VEC>(lrow + e);
      if (read_prompt) {
        prompt[u] = load_vec<uint8_t, VEC>(prow + e);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) prompt[u].v[j] = 0;
      }
      if constexpr (FUSED) {
        count[u] = load_vec<int32_t, VEC>(crow + e);
      } else {
        const Vec<uint8_t, VEC> o = load_vec<uint8_t, VEC>(orow + e);
#pragma unroll
        for (int j = 0; j < VEC; ++j) count[u].v[j] = o.v[j] != 0;
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t e = (g0 + u * c.bdim) * VEC;
      if (e >= p.vocab) continue;
      Vec<T, VEC> out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float x = to_float(logit[u].v[j]);
        const float y = FUSED ? penalize(x, prompt[u].v[j] != 0, count[u].v[j], rep, freq, pres)
                              : repetition_penalize(x, prompt[u].v[j] != 0 || count[u].v[j] != 0, rep);
        out.v[j] = from_float<T>(y);
      }
      store_vec<T, VEC>(lrow + e, out);
    }
  }
}

}  // namespace specops
