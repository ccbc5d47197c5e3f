// Grammar bitmask apply: logits[r, j] = -inf where bit j % 32 of word j / 32 of bitmask
// row r is 0. Only disallowed logits are written and logits are never read: the
// minimum traffic is the bitmask plus the written logits.
#pragma once
#include "cuda/device_utils.cuh"

namespace specops {

inline LaunchConfig bitmask_config(const BitmaskParams& p, FloatType dtype, int num_sms) {
  const int esz = float_size(dtype), vec = 16 / esz;
  const bool vectorised = aligned(p.logits, p.logits_stride * esz, 16) && p.vocab % vec == 0;
  return row_chunk_config(p.n, p.vocab, vectorised ? vec : 1, num_sms);
}

// -inf as a 32-bit word: one float, or two 16-bit halves.
template <typename T>
SPECOPS_HD uint32_t neg_inf_word() {
  if constexpr (std::is_same<T, float>::value) return 0xFF800000u;
  else if constexpr (std::is_same<T, __half>::value) return 0xFC00FC00u;
  else return 0xFF80FF80u;  // bfloat16
}

// One thread: UNROLL groups of VEC consecutive logits of each row it visits (all bitmask
// words loaded before any store), rows visited with stride gridDim.y.
template <typename T, int VEC, int UNROLL>
SPECOPS_HD void bitmask_thread(const BitmaskParams& p, const Coord& c) {
  constexpr uint32_t kAll = VEC == 32 ? 0xFFFFFFFFu : (1u << VEC) - 1u;
  // VEC > 1 only when VEC divides vocab, so a group is either wholly inside or past the end.
  const int64_t g0 = c.bx * c.bdim * UNROLL + c.tx;
  const T neg_inf = from_float<T>(-INFINITY);
  for (int64_t i = c.by; i < p.n; i += c.gy) {
    const int64_t r = p.indices == nullptr ? i : load_index(p.indices, p.indices_int64, i);
    if (r < 0 || r >= p.valid_rows) continue;
    const int32_t* brow = p.bitmask + r * p.bitmask_stride;
    T* lrow = static_cast<T*>(p.logits) + r * p.logits_stride;
    uint32_t bits[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t e = (g0 + u * c.bdim) * VEC;
      bits[u] = e < p.vocab ? (static_cast<uint32_t>(brow[e >> 5]) >> (e & 31)) & kAll : kAll;
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (bits[u] == kAll) continue;  // every token of the group allowed (or past the end)
      T* dst = lrow + (g0 + u * c.bdim) * VEC;
      if (VEC > 1 && bits[u] == 0) {  // one 16-byte store of -inf
        const uint32_t w = neg_inf_word<T>();
        store_vec<uint32_t, 4>(reinterpret_cast<uint32_t*>(dst), Vec<uint32_t, 4>{{w, w, w, w}});
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          if (!((bits[u] >> j) & 1u)) dst[j] = neg_inf;
      }
    }
  }
}

}  // namespace specops
