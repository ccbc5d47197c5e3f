// Grammar bitmask apply: logits[r, j] = -inf where bit j % 32 of word j / 32 of bitmask row r
// is 0 (xgrammar's rule).
//
// HBM with ECC writes whole 32-byte sectors: a partial write makes DRAM read the sector
// first anyway. So the least an apply can move, per sector of logits, is:
//   every token allowed      nothing
//   every token disallowed   the sector written with -inf, never read
//   mixed                    the sector read, selected and written back
// plus the bitmask: the floor that bench/bench_ops.py reports. Both kernels below move a
// 16-byte chunk (half a sector) per thread access; a warp's access covers 512 contiguous
// bytes.
//   chunk kernel  every 16-byte aligned layout of up to 65535 rows: 1 or 2 chunks per
//                 thread, a block per 256 or 512 chunks of one row, no row loop. A chunk
//                 is skipped (all ones), filled (all zeros) or read and selected, on its own
//                 bits only: where one half of a sector is skipped and the other written,
//                 the DRAM merges the sector (rare with grammar masks). On small batches it
//                 loads every chunk together with its bits ("eager": one DRAM round trip
//                 instead of two, the bandwidth being idle anyway).
//   grid kernel   the rest (rows not 16-byte aligned, more rows than gridDim.y): rows in a
//                 loop, kBitmaskUnroll chunks per thread, each planned with its sector
//                 partner (the neighbouring lane), so that a sector is written whole or not
//                 at all; rows that are not 16-byte aligned go one logit at a time.
// bench/exp_bitmask.cu compared them on the H200 (logs/exp_bitmask_2026-11-30*.txt): with
// grammar masks the chunk kernel is 5-14% faster than the grid kernel at B >= 128 and 10-20%
// at B <= 32, and as fast with random masks.
#pragma once
#include "cuda/device_utils.cuh"

namespace specops {

constexpr int kBitmaskUnroll = 2;  // 16-byte chunks per thread on the vector path (see bitmask.cu)

// Whether every row that can be touched starts 16-byte aligned (the vector path).
inline bool bitmask_rows_aligned(const BitmaskParams& p, int esz) {
  const bool one_row = p.valid_rows <= 1;  // only row 0 is touched: the row stride never matters
  return aligned(p.logits, one_row ? 16 : p.logits_stride * esz, 16);
}

// Vector path (16-byte chunks) where every row starts 16-byte aligned, else one logit per
// access. Small batches get narrower blocks, so that a single row still spreads over the SMs.
inline LaunchConfig bitmask_config(const BitmaskParams& p, FloatType dtype, int num_sms) {
  const int esz = float_size(dtype);
  const bool vectorised = bitmask_rows_aligned(p, esz);
  LaunchConfig cfg = row_chunk_config(p.n, p.vocab, vectorised ? 16 / esz : 1,
                                     vectorised ? kBitmaskUnroll : kUnroll, num_sms);
  const int64_t chunks = ceil_div(p.vocab, cfg.vec);
  while (!cfg.empty() && cfg.block > 64 && cfg.grid_x * cfg.grid_y < num_sms) {
    cfg.block /= 2;
    cfg.grid_x = ceil_div(chunks, int64_t{cfg.block} * cfg.unroll);
  }
  return cfg;
}

// Two chunks per thread once that grid still has a block for every third SM (fp32 B=1,
// V=128256: 63 blocks, 1.51 us against 1.66 with one chunk; bf16 B=1: 32 blocks, 1.76
// against 1.62); eager loads while the logits covered are at most kChunkKernelEagerBytes
// (fp32 V=151936 B=8, 4.6 MiB: 2.59 against 2.88 lazily; bf16 V=128256 B=32, 7.8 MiB:
// 4.01 against 3.89).
constexpr int64_t kChunkKernelEagerBytes = int64_t{6} << 20;

struct BitmaskChunkConfig {
  bool use = false;    // else the grid kernel (bitmask_config)
  int per_thread = 1;  // chunks per thread: 1 or 2
  bool eager = false;  // load every chunk with its bits
  int64_t grid_x = 0;  // blocks along a row, kBlock * per_thread chunks each
  int64_t rows = 0;    // gridDim.y: p.n entries with indices, else min(p.n, p.valid_rows) rows
};

inline BitmaskChunkConfig bitmask_chunk_config(const BitmaskParams& p, FloatType dtype, int num_sms) {
  BitmaskChunkConfig cfg;
  const int esz = float_size(dtype);
  cfg.rows = p.indices != nullptr ? p.n : std::min(p.n, p.valid_rows);
  if (cfg.rows <= 0 || p.vocab <= 0 || cfg.rows > kMaxGridY || !bitmask_rows_aligned(p, esz)) return cfg;
  cfg.use = true;
  const int64_t chunks = ceil_div(p.vocab, 16 / esz);
  cfg.per_thread = 3 * cfg.rows * ceil_div(chunks, 2 * kBlock) >= num_sms ? 2 : 1;
  cfg.grid_x = ceil_div(chunks, int64_t{kBlock} * cfg.per_thread);
  cfg.eager = cfg.rows * p.vocab * esz <= kChunkKernelEagerBytes;
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

// The row's last chunk, cut by the vocab (logits e .. vocab - 1): one logit at a time.
template <typename T, int VEC>
SPECOPS_HD void mask_tail(T* lrow, int e, uint32_t bits, int vocab) {
  for (int j = 0; j < VEC && e + j < vocab; ++j)
    if (!((bits >> j) & 1u)) lrow[e + j] = from_float<T>(-INFINITY);
}

// Stores the 16-byte chunk at p: all -inf if `fill`, else v with the logits whose bit is 0
// replaced by -inf.
template <typename T>
SPECOPS_HD void store_masked_chunk(T* p, const Vec<uint32_t, 4>& v, uint32_t bits, bool fill) {
  Vec<uint32_t, 4> out;
#pragma unroll
  for (int k = 0; k < 4; ++k) out.v[k] = fill ? neg_inf_word<T>() : select_word<T>(v.v[k], bits, k);
  store_vec<uint32_t, 4>(reinterpret_cast<uint32_t*>(p), out);
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
    if (plan[u] == kTail) mask_tail<T, VEC>(lrow, e, own[u], vocab);
    else store_masked_chunk<T>(lrow + e, v[u], own[u], plan[u] == kFill);
  }
}

// Chunk kernel: chunks c, c + step, ... (U of them; chunk c = logits c * VEC .. + VEC - 1) of
// one 16-byte aligned row. All bits are loaded first, then the logits that must be read
// (every whole chunk if EAGER), then everything is stored.
template <typename T, int VEC, int U, bool EAGER>
SPECOPS_HD void mask_chunk_group(T* lrow, const int32_t* brow, int vocab, int c, int step) {
  using Chunk = Vec<uint32_t, 4>;
  constexpr uint32_t kAll = (1u << VEC) - 1u;
  uint32_t bits[U];
  Chunk v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int e = (c + u * step) * VEC;
    bits[u] = e < vocab ? bits_at<VEC>(brow, e) : kAll;
    if (EAGER && e + VEC <= vocab) v[u] = load_vec<uint32_t, 4>(reinterpret_cast<const uint32_t*>(lrow + e));
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int e = (c + u * step) * VEC;
    if (!EAGER && e + VEC <= vocab && bits[u] != 0 && bits[u] != kAll)
      v[u] = load_vec<uint32_t, 4>(reinterpret_cast<const uint32_t*>(lrow + e));
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int e = (c + u * step) * VEC;
    if (bits[u] == kAll) continue;  // every logit allowed, or past the row
    if (e + VEC > vocab) mask_tail<T, VEC>(lrow, e, bits[u], vocab);
    else store_masked_chunk<T>(lrow + e, v[u], bits[u], bits[u] == 0);
  }
}

// Chunk kernel, one thread: chunks (bx * U + u) * kBlock + tx of the row that entry i
// (< BitmaskChunkConfig::rows) names, for u < U.
template <typename T, int VEC, int U, bool INDICES, bool EAGER>
SPECOPS_HD void bitmask_chunk_thread(const BitmaskParams& p, int64_t i, int bx, int tx) {
  const int64_t r = INDICES ? load_index(p.indices, p.indices_int64, i) : i;  // without indices, i < valid_rows
  if (INDICES && (r < 0 || r >= p.valid_rows)) return;
  mask_chunk_group<T, VEC, U, EAGER>(static_cast<T*>(p.logits) + r * p.logits_stride, p.bitmask + r * p.bitmask_stride,
                                     static_cast<int>(p.vocab), bx * U * kBlock + tx, kBlock);
}

// Grid kernel, one thread: UNROLL accesses (16-byte chunks, or single logits where VEC == 1) of each row
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
