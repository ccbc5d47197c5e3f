// Grammar bitmask apply: logits[r, j] = -inf where bit j % 32 of word j / 32 of bitmask row r
// is 0 (xgrammar's rule).
//
// HBM with ECC writes whole 32-byte sectors: a partial write makes DRAM read the sector
// first anyway. So the work is planned per sector of logits:
//   every token allowed      nothing moves
//   every token disallowed   the sector is written with -inf, never read
//   mixed                    the sector is read, selected and written back whole
// which moves the bitmask + 32 B per disallowed sector + 64 B per mixed sector, the floor
// that bench/bench_ops.py reports. One thread access is a 16-byte chunk (half a sector): the
// two halves of a sector sit in neighbouring lanes, take the same branch and so store in the
// same instruction (one full-sector write), and a warp's access covers 512 contiguous bytes.
// Rows that are not 16-byte aligned go one logit at a time.
#pragma once
#include "cuda/device_utils.cuh"

namespace specops {

constexpr int kBitmaskUnroll = 2;  // 16-byte chunks per thread on the vector path (see bitmask.cu)

// Vector path (16-byte chunks) where every row starts 16-byte aligned, else one logit per
// access. Small batches get narrower blocks, so that a single row still spreads over the SMs.
inline LaunchConfig bitmask_config(const BitmaskParams& p, FloatType dtype, int num_sms) {
  const int esz = float_size(dtype);
  const bool one_row = p.valid_rows <= 1;  // only row 0 is touched: the row stride never matters
  const bool vectorised = aligned(p.logits, one_row ? 16 : p.logits_stride * esz, 16);
  LaunchConfig cfg = row_chunk_config(p.n, p.vocab, vectorised ? 16 / esz : 1,
                                     vectorised ? kBitmaskUnroll : kUnroll, num_sms);
  const int64_t chunks = ceil_div(p.vocab, cfg.vec);
  while (!cfg.empty() && cfg.block > 64 && cfg.grid_x * cfg.grid_y < num_sms) {
    cfg.block /= 2;
    cfg.grid_x = ceil_div(chunks, int64_t{cfg.block} * cfg.unroll);
  }
  return cfg;
}

// -inf as a 32-bit word: one float, or two 16-bit halves.
template <typename T>
SPECOPS_HD uint32_t neg_inf_word() {
  if constexpr (std::is_same<T, float>::value) return 0xFF800000u;
  else if constexpr (std::is_same<T, __half>::value) return 0xFC00FC00u;
  else return 0xFF80FF80u;  // bfloat16
}

// The N bits of logits e .. e + N - 1 (N divides 32 and e, so they lie in one word).
template <int N>
SPECOPS_HD uint32_t bits_at(const int32_t* brow, int e) {
  constexpr uint32_t kAll = N == 32 ? 0xFFFFFFFFu : (1u << N) - 1u;
  return (static_cast<uint32_t>(brow[e >> 5]) >> (e & 31)) & kAll;
}

// Word k of a 16-byte chunk (one fp32 or two 16-bit logits) with the logits whose bit is 0
// replaced by -inf; the others keep their exact bits (NaN payloads too).
template <typename T>
SPECOPS_HD uint32_t select_word(uint32_t word, uint32_t bits, int k) {
  uint32_t keep;
  if constexpr (sizeof(T) == 4) {
    keep = 0u - ((bits >> k) & 1u);
  } else {
    keep = ((0u - ((bits >> (2 * k)) & 1u)) & 0x0000FFFFu) | ((0u - ((bits >> (2 * k + 1)) & 1u)) & 0xFFFF0000u);
  }
  return (word & keep) | (neg_inf_word<T>() & ~keep);
}

// One logit per access: logits g0, g0 + step, ... (UNROLL of them) of one row.
template <typename T, int UNROLL>
SPECOPS_HD void mask_logits(T* lrow, const int32_t* brow, int vocab, int g0, int step) {
  bool masked[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int e = g0 + u * step;
    masked[u] = e < vocab && bits_at<1>(brow, e) == 0;
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
    if (masked[u]) lrow[g0 + u * step] = from_float<T>(-INFINITY);
}

// 16-byte chunks g0, g0 + step, ... (UNROLL of them) of one 16-byte aligned row, each
// planned with the other half of its 32-byte sector (see the top of this file). All bitmask
// words are loaded first, then all the logits that must be read, then everything is stored.
template <typename T, int VEC, int UNROLL>
SPECOPS_HD void mask_chunks(T* lrow, const int32_t* brow, int vocab, int g0, int step) {
  using Chunk = Vec<uint32_t, 4>;
  constexpr uint32_t kAll = (1u << VEC) - 1u;
  enum Plan { kSkip, kFill, kSelect, kTail };
  // The sector partner of chunk g is g + 1 or g - 1: which, depends on the row's address.
  const int odd = static_cast<int>((reinterpret_cast<uintptr_t>(lrow) >> 4) & 1);
  uint32_t own[UNROLL], other[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int g = g0 + u * step, e = g * VEC, pe = ((g + odd) & 1) ? e - VEC : e + VEC;
    own[u] = e < vocab ? bits_at<VEC>(brow, e) : kAll;
    other[u] = pe >= 0 && pe < vocab ? bits_at<VEC>(brow, pe) : kAll;  // past the row: nothing to merge with
  }
  Plan plan[UNROLL];
  Chunk v[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int e = (g0 + u * step) * VEC;
    if (e >= vocab || (own[u] == kAll && other[u] == kAll)) plan[u] = kSkip;
    else if (e + VEC > vocab) plan[u] = kTail;  // the row's last chunk, cut by the vocab: per logit
    else if (own[u] == 0) plan[u] = kFill;      // -inf, whatever the partner needs
    else plan[u] = kSelect;                     // read, select, write back (all of it if own is all ones)
    if (plan[u] == kSelect) v[u] = load_vec<uint32_t, 4>(reinterpret_cast<const uint32_t*>(lrow + e));
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int e = (g0 + u * step) * VEC;
    if (plan[u] == kSkip) continue;
    if (plan[u] == kTail) {
      for (int j = 0; j < VEC && e + j < vocab; ++j)
        if (!((own[u] >> j) & 1u)) lrow[e + j] = from_float<T>(-INFINITY);
      continue;
    }
    Chunk out;
#pragma unroll
    for (int k = 0; k < 4; ++k) out.v[k] = plan[u] == kFill ? neg_inf_word<T>() : select_word<T>(v[u].v[k], own[u], k);
    store_vec<uint32_t, 4>(reinterpret_cast<uint32_t*>(lrow + e), out);
  }
}

// One thread: UNROLL accesses (16-byte chunks, or single logits where VEC == 1) of each row
// it visits, rows visited with stride gridDim.y.
template <typename T, int VEC, int UNROLL>
SPECOPS_HD void bitmask_thread(const BitmaskParams& p, const Coord& c) {
  // Offsets within a row fit in int (the launcher checks vocab < 2^31 - 2^20), which keeps
  // the unrolled body within 64 registers (see the kernel's launch bounds).
  const int g0 = static_cast<int>(c.bx * c.bdim * UNROLL + c.tx), step = static_cast<int>(c.bdim);
  const int vocab = static_cast<int>(p.vocab);
  for (int64_t i = c.by; i < p.n; i += c.gy) {
    const int64_t r = p.indices == nullptr ? i : load_index(p.indices, p.indices_int64, i);
    if (r < 0 || r >= p.valid_rows) continue;
    const int32_t* brow = p.bitmask + r * p.bitmask_stride;
    T* lrow = static_cast<T*>(p.logits) + r * p.logits_stride;
    if constexpr (VEC == 1) mask_logits<T, UNROLL>(lrow, brow, vocab, g0, step);
    else mask_chunks<T, VEC, UNROLL>(lrow, brow, vocab, g0, step);
  }
}

}  // namespace specops
