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

// 16-byte chunks per thread on the vector path at large batches. A thread waits twice before
// its last store (for its bitmask words, then for the logits of its mixed sectors), so with
// grammar-like masks an SM writes about what its resident threads hold per two memory
// latencies: at 4 chunks (64 bytes) per thread the H200 run of bench_ops wrote 2.5 TB/s where
// a plain fill writes 4.6. 8 chunks double that, still within 64 registers.
constexpr int kBitmaskVecUnroll = 8;

// Vector path (16-byte chunks) where every row starts 16-byte aligned, else one logit per
// access. Small batches (one access per thread) get narrower blocks, so that a single row
// still spreads over the SMs; unrolled blocks are always kBlock wide (bitmask_thread relies on it).
inline LaunchConfig bitmask_config(const BitmaskParams& p, FloatType dtype, int num_sms) {
  const int esz = float_size(dtype);
  const bool one_row = p.valid_rows <= 1;  // only row 0 is touched: the row stride never matters
  const bool vectorised = aligned(p.logits, one_row ? 16 : p.logits_stride * esz, 16);
  LaunchConfig cfg = vectorised ? row_chunk_config(p.n, p.vocab, 16 / esz, kBitmaskVecUnroll, num_sms)
                                : row_chunk_config(p.n, p.vocab, 1, kUnroll, num_sms);
  const int64_t chunks = ceil_div(p.vocab, cfg.vec);
  while (!cfg.empty() && cfg.unroll == 1 && cfg.block > 64 && cfg.grid_x * cfg.grid_y < num_sms) {
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
// planned with the other half of its 32-byte sector (see the top of this file), in three
// steps: the bitmask words; the loads of the chunks to select; the stores, -inf fills first
// (they wait for no load) and then the selected chunks. The two halves of a sector always
// get the same plan, so they are stored by the same instruction.
template <typename T, int VEC, int UNROLL>
SPECOPS_HD void mask_chunks(T* lrow, const int32_t* brow, int vocab, int g0, int step) {
  using Chunk = Vec<uint32_t, 4>;
  constexpr uint32_t kAll = (1u << VEC) - 1u;
  // Chunk u starts at logit e0 + u * span, and span is a multiple of 32: the bits of every
  // chunk (and of every partner) sit at one shift, in words u * span / 32 apart.
  const int e0 = g0 * VEC, span = step * VEC;
  // The sector partner of chunk g is g + 1 or g - 1: which, depends on the row's address.
  const int odd = static_cast<int>((reinterpret_cast<uintptr_t>(lrow) >> 4) & 1);
  const int pe0 = ((g0 + odd) & 1) ? e0 - VEC : e0 + VEC;
  const int own_w0 = e0 >> 5, other_w0 = pe0 >> 5;  // words of chunk 0 and of its partner
  static_assert(UNROLL * VEC <= 64, "the chunks' bits are kept in one 64-bit word");
  uint32_t mine[UNROLL], other[UNROLL];
  // Every bitmask load first, none behind a branch or a bounds check where the thread's
  // chunks and partners all lie inside the row (all threads but those at a row's ends).
  if (pe0 >= 0 && e0 + (UNROLL - 1) * span + 2 * VEC <= vocab) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      mine[u] = static_cast<uint32_t>(brow[own_w0 + u * (span >> 5)]);
      other[u] = static_cast<uint32_t>(brow[other_w0 + u * (span >> 5)]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      mine[u] = (mine[u] >> (e0 & 31)) & kAll;
      other[u] = (other[u] >> (pe0 & 31)) & kAll;
    }
  } else {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int e = e0 + u * span, pe = pe0 + u * span, w = u * (span >> 5);
      mine[u] = e < vocab ? (static_cast<uint32_t>(brow[own_w0 + w]) >> (e0 & 31)) & kAll : kAll;
      // A partner outside the row is no partner: the chunk is then its sector's only part.
      other[u] = pe >= 0 && pe < vocab ? (static_cast<uint32_t>(brow[other_w0 + w]) >> (pe0 & 31)) & kAll : mine[u];
    }
  }
  // Bits u * VEC ..: the bits of chunk u (kept for the selects, in one or two registers).
  using Bits = typename std::conditional<(UNROLL * VEC > 32), uint64_t, uint32_t>::type;
  Bits own = 0;
  uint32_t fill = 0, select = 0;  // bit u: the plan of chunk u (neither: skip it)
  bool tail = false;              // the row's last chunk, cut by the vocab, is this thread's
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int e = e0 + u * span;
    own |= static_cast<Bits>(mine[u]) << (u * VEC);
    if (e >= vocab || (mine[u] == kAll && other[u] == kAll)) continue;  // nothing to write
    if (e + VEC > vocab) tail = true;                                 // per logit, below
    else if (mine[u] == 0 && other[u] == 0) fill |= 1u << u;          // the whole sector becomes -inf
    else select |= 1u << u;                                           // read, select, write back (all of it)
  }
  Chunk v[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
    if ((select >> u) & 1u) v[u] = load_vec<uint32_t, 4>(reinterpret_cast<const uint32_t*>(lrow + e0 + u * span));
  const uint32_t w = neg_inf_word<T>();
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
    if ((fill >> u) & 1u) store_vec<uint32_t, 4>(reinterpret_cast<uint32_t*>(lrow + e0 + u * span), Chunk{{w, w, w, w}});
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    if (!((select >> u) & 1u)) continue;
    const uint32_t bits = static_cast<uint32_t>(own >> (u * VEC)) & kAll;
    Chunk out;
#pragma unroll
    for (int k = 0; k < 4; ++k) out.v[k] = select_word<T>(v[u].v[k], bits, k);
    store_vec<uint32_t, 4>(reinterpret_cast<uint32_t*>(lrow + e0 + u * span), out);
  }
  if (tail) {
    const int e = vocab / VEC * VEC;
    const uint32_t bits = bits_at<VEC>(brow, e);
    for (int j = 0; e + j < vocab; ++j)
      if (!((bits >> j) & 1u)) lrow[e + j] = from_float<T>(-INFINITY);
  }
}

// One thread: UNROLL accesses (16-byte chunks, or single logits where VEC == 1) of each row
// it visits, rows visited with stride gridDim.y.
template <typename T, int VEC, int UNROLL>
SPECOPS_HD void bitmask_thread(const BitmaskParams& p, const Coord& c) {
  // Offsets within a row fit in int (the launcher checks vocab < 2^31 - 2^20), and unrolled
  // blocks are always kBlock wide, so a thread's accesses sit at constant distances from its
  // first one: both keep the unrolled body within 64 registers (see the kernel's launch bounds).
  const int step = UNROLL > 1 ? kBlock : static_cast<int>(c.bdim);
  const int g0 = static_cast<int>(c.bx * step * UNROLL + c.tx);
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
