// Penalties in one pass over the logits: read logits + prompt mask + output counts (or the
// output mask), write logits. Rows whose penalties are neutral are skipped entirely, and the
// prompt mask is not read for rows without a repetition penalty.
//
// On the H200, fused fp32 (13 bytes per logit), fused bf16 (9) and fp32 repetition (10) ran
// at about one rate in logits per second: the limit was the loads each SM keeps in flight (a
// thread loads all its inputs, waits, computes, stores), not the bytes. So the vector path moves 16 logits per thread
// in every dtype (four 16-byte fp32 vectors, or two of 8 bf16/fp16 logits with an 8-byte mask
// load and two 16-byte count loads each) in few enough registers for 4 (fused) or 5
// (repetition only) 256-thread blocks per SM. (32 bf16 logits per thread took 122 registers:
// 2 blocks per SM, a compute phase twice as long, and bf16 ran at fp32's element rate.)
#pragma once
#include <cstring>

#include "common/penalty_math.h"
#include "cuda/device_utils.cuh"

namespace specops {

constexpr int kPenaltyElems = 16;  // logits per thread on the vector path at large batches

// Vector groups per thread on the vector path, for logits of `esz` bytes (16-byte groups).
constexpr int penalty_vec_unroll(int esz) { return kPenaltyElems * esz / 16; }

inline LaunchConfig penalty_config(const PenaltyParams& p, FloatType dtype, int num_sms) {
  const int esz = float_size(dtype), vec = 16 / esz;
  const bool fused = p.output_counts != nullptr;
  const bool vectorised =
      p.vocab % vec == 0 && aligned(p.logits, p.logits_stride * esz, 16) &&
      aligned(p.prompt_mask, p.prompt_stride, vec) &&
      (fused ? aligned(p.output_counts, p.counts_stride * 4, 16) : aligned(p.output_mask, p.output_stride, vec));
  return vectorised ? row_chunk_config(p.rows, p.vocab, vec, penalty_vec_unroll(esz), num_sms)
                    : row_chunk_config(p.rows, p.vocab, 1, kUnroll, num_sms);
}

// VEC one-byte bool flags read as whole 32-bit words (one 4- or 8-byte load where VEC is 4 or
// 8): flag j is byte j % 4 of word j / 4, tested in place.
template <int VEC>
struct Flags {
  static constexpr int kWords = (VEC + 3) / 4;
  uint32_t w[kWords];
  SPECOPS_HD bool operator[](int j) const { return (w[j / 4] & (0xFFu << (8 * (j % 4)))) != 0; }
};

template <int VEC>
SPECOPS_HD Flags<VEC> load_flags(const bool* p) {
  Flags<VEC> f;
  if constexpr (VEC % 4 == 0) {
    const Vec<uint32_t, VEC / 4> v = load_vec<uint32_t, VEC / 4>(reinterpret_cast<const uint32_t*>(p));
#pragma unroll
    for (int k = 0; k < VEC / 4; ++k) f.w[k] = v.v[k];
  } else {
    f.w[0] = 0;
#pragma unroll
    for (int j = 0; j < VEC; ++j) f.w[0] |= static_cast<uint32_t>(reinterpret_cast<const uint8_t*>(p)[j]) << (8 * j);
  }
  return f;
}

template <int VEC>
SPECOPS_HD Flags<VEC> no_flags() {
  Flags<VEC> f;
#pragma unroll
  for (int k = 0; k < Flags<VEC>::kWords; ++k) f.w[k] = 0;
  return f;
}

// FUSED: repetition + frequency + presence from output_counts; else repetition from output_mask.
template <typename T, int VEC, int UNROLL, bool FUSED>
SPECOPS_HD void penalty_thread(const PenaltyParams& p, const Coord& c) {
  // Offsets within a row fit in int (the launcher checks vocab < 2^31 - 2^20) and blocks are
  // kBlock wide, so a thread's accesses sit at constant distances: fewer registers.
  const int g0 = static_cast<int>(c.bx * kBlock * UNROLL + c.tx), step = kBlock;
  const int vocab = static_cast<int>(p.vocab);
  for (int64_t r = c.by; r < p.rows; r += c.gy) {
    const float rep = p.repetition[r];
    const float freq = FUSED ? p.frequency[r] : 0.0f;
    const float pres = FUSED ? p.presence[r] : 0.0f;
    if (penalties_neutral(rep, freq, pres)) continue;
    const bool read_prompt = rep != 1.0f;
    T* lrow = static_cast<T*>(p.logits) + r * p.logits_stride;
    const bool* prow = p.prompt_mask + r * p.prompt_stride;
    const int32_t* crow = FUSED ? p.output_counts + r * p.counts_stride : nullptr;
    const bool* orow = FUSED ? nullptr : p.output_mask + r * p.output_stride;

    // Every load of the thread first, then the arithmetic, then the stores. Vector logits stay
    // in the 32-bit words they were loaded as until used: 16-bit halves unpacked right after a
    // load would make the next loads wait for it.
    using Raw = typename std::conditional<VEC == 1, Vec<T, 1>, Vec<uint32_t, 4>>::type;
    Raw logit[UNROLL];
    Flags<VEC> seen[UNROLL];  // FUSED: in the prompt; else in the prompt or the output
    Vec<int32_t, VEC> count[UNROLL];  // FUSED only
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int e = (g0 + u * step) * VEC;
      if (e >= vocab) continue;  // VEC > 1 only when VEC divides vocab
      logit[u] = *reinterpret_cast<const Raw*>(lrow + e);
      seen[u] = read_prompt ? load_flags<VEC>(prow + e) : no_flags<VEC>();
      if constexpr (FUSED) {
        count[u] = load_vec<int32_t, VEC>(crow + e);
      } else {
        const Flags<VEC> out = load_flags<VEC>(orow + e);
#pragma unroll
        for (int k = 0; k < Flags<VEC>::kWords; ++k) seen[u].w[k] |= out.w[k];
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int e = (g0 + u * step) * VEC;
      if (e >= vocab) continue;
      Vec<T, VEC> in, out;
      static_assert(sizeof(in) == sizeof(Raw), "16 bytes, or one logit");
      std::memcpy(&in, &logit[u], sizeof(in));
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float x = to_float(in.v[j]);
        const float y = FUSED ? penalize(x, seen[u][j], count[u].v[j], rep, freq, pres)
                              : repetition_penalize(x, seen[u][j], rep);
        out.v[j] = from_float<T>(y);
      }
      store_vec<T, VEC>(lrow + e, out);
    }
  }
}

}  // namespace specops
