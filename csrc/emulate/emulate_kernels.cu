// Runs every CUDA kernel body on the CPU, one emulated thread after another, with the
// launch configuration the launchers compute, and compares the results bit for bit with
// plain loops. Catches indexing, vector-path and tail mistakes without a GPU.
// Built and run by scripts/check_cuda_compile.sh:
//   nvcc -std=c++17 -arch=sm_90 -Icsrc --expt-relaxed-constexpr csrc/emulate/emulate_kernels.cu
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/penalty_math.h"
#include "cuda/bincount_kernels.cuh"
#include "cuda/bitmask_kernels.cuh"
#include "cuda/penalties_kernels.cuh"

using namespace specops;

static int g_failures = 0;
static std::mt19937_64 rng(1234);

#define EXPECT(cond, ...)                                  \
  do {                                                     \
    if (!(cond)) {                                         \
      ++g_failures;                                        \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__);     \
      std::printf(__VA_ARGS__);                            \
      std::printf("\n");                                   \
    }                                                      \
  } while (0)

template <typename Body>
void run_grid(const LaunchConfig& cfg, Body&& body) {
  for (int64_t by = 0; by < cfg.grid_y; ++by)
    for (int64_t bx = 0; bx < cfg.grid_x; ++bx)
      for (int64_t tx = 0; tx < cfg.block; ++tx) body(Coord{bx, by, tx, cfg.grid_x, cfg.grid_y, cfg.block});
}

// 64-byte aligned storage with an optional element offset (to force the unaligned path).
template <typename T>
struct Buf {
  std::vector<unsigned char> raw;
  T* ptr;
  Buf(int64_t n, int64_t offset = 0) : raw((n + offset) * sizeof(T) + 128) {
    uintptr_t a = (reinterpret_cast<uintptr_t>(raw.data()) + 63) & ~uintptr_t{63};
    ptr = reinterpret_cast<T*>(a) + offset;
  }
};

template <typename T>
T random_logit() {
  std::uniform_real_distribution<float> d(-5.0f, 5.0f);
  return from_float<T>(d(rng));
}

template <typename T>
const char* type_name() {
  return sizeof(T) == 4 ? "fp32" : (std::is_same<T, __half>::value ? "fp16" : "bf16");
}

// ---------------- bitmask ----------------
// A NaN with a payload (fp32, or fp16 and bf16 alike): kept logits must keep their exact bits.
template <typename T>
void set_nan_payload(T* x) {
  const uint32_t w32 = 0x7FC12345u;
  const uint16_t w16 = 0x7FC1u;
  if (sizeof(T) == 4) std::memcpy(x, &w32, 4);
  else std::memcpy(x, &w16, 2);
}

// All ones, all zeros, random, or pieces of 8 / 16 bits (an fp32 / 16-bit sector) each all
// ones, all zeros or random: every sector kind, in every position of a word.
int32_t random_bitmask_word() {
  const int kind = rng() % 5;
  if (kind < 3) return kind == 0 ? -1 : kind == 1 ? 0 : static_cast<int32_t>(rng());
  const int piece = kind == 3 ? 8 : 16;
  uint32_t w = 0;
  for (int s = 0; s < 32; s += piece) {
    const int k = rng() % 3;
    const uint32_t bits = k == 0 ? 0xFFFFFFFFu : k == 1 ? 0u : static_cast<uint32_t>(rng());
    w |= (bits & ((1u << piece) - 1u)) << s;
  }
  return static_cast<int32_t>(w);
}

template <typename T>
void test_bitmask(int64_t logits_rows, int64_t cols, int64_t pad, int64_t bitmask_rows, int64_t words,
                  int index_mode /*0 none, 1 int32, 2 int64*/, int64_t offset, int num_sms) {
  const int64_t ls = cols + pad, bs = words + 1;
  const int64_t total = logits_rows * ls + 64;  // + a guard zone past the last row, compared too
  Buf<T> logits(total, offset);
  Buf<int32_t> bitmask(bitmask_rows * bs);
  for (int64_t i = 0; i < total; ++i) logits.ptr[i] = random_logit<T>();
  for (int64_t i = 0; i < total; i += 97) set_nan_payload(&logits.ptr[i]);
  for (int64_t i = 0; i < bitmask_rows * bs; ++i) bitmask.ptr[i] = random_bitmask_word();
  std::vector<int64_t> idx;
  const int64_t valid = std::min(logits_rows, bitmask_rows);
  if (index_mode) {
    const int64_t n = 1 + rng() % (2 * logits_rows + 1);
    for (int64_t i = 0; i < n; ++i) idx.push_back(static_cast<int64_t>(rng() % (valid + 4)) - 2);  // some out of range
  }
  std::vector<int32_t> idx32(idx.begin(), idx.end());
  std::vector<T> ref(logits.ptr, logits.ptr + total);

  BitmaskParams p{};
  p.logits = logits.ptr;
  p.logits_stride = ls;
  p.bitmask = bitmask.ptr;
  p.bitmask_stride = bs;
  p.indices = index_mode == 0 ? nullptr : index_mode == 1 ? static_cast<const void*>(idx32.data()) : idx.data();
  p.indices_int64 = index_mode == 2;
  p.n = index_mode ? static_cast<int64_t>(idx.size()) : logits_rows;
  p.valid_rows = valid;
  p.vocab = std::min(cols, words * 32);
  const FloatType ft = sizeof(T) == 4 ? FloatType::kFloat32
                       : std::is_same<T, __half>::value ? FloatType::kFloat16 : FloatType::kBFloat16;
  const T neg_inf = from_float<T>(-INFINITY);
  for (int64_t i = 0; i < p.n; ++i) {
    const int64_t r = index_mode ? idx[i] : i;
    if (r < 0 || r >= valid) continue;
    for (int64_t j = 0; j < p.vocab; ++j)
      if (!((static_cast<uint32_t>(bitmask.ptr[r * bs + j / 32]) >> (j % 32)) & 1u)) ref[r * ls + j] = neg_inf;
  }
  const std::vector<T> init(logits.ptr, logits.ptr + total);
  auto check = [&](const char* kernel, const LaunchConfig& cfg) {
    const bool same = std::memcmp(ref.data(), logits.ptr, ref.size() * sizeof(T)) == 0;
    EXPECT(same,
           "bitmask %s %s rows=%lld cols=%lld pad=%lld words=%lld idx=%d off=%lld sms=%d (vec=%d unroll=%d block=%d)",
           kernel, type_name<T>(), (long long)logits_rows, (long long)cols, (long long)pad, (long long)words,
           index_mode, (long long)offset, num_sms, cfg.vec, cfg.unroll, cfg.block);
    std::memcpy(logits.ptr, init.data(), init.size() * sizeof(T));
  };

  // The grid kernel, with the configuration its launcher would use.
  const LaunchConfig cfg = bitmask_config(p, ft, num_sms);
  with_vec_unroll<T, kBitmaskUnroll>(cfg, [&](auto vec, auto unroll) {
    run_grid(cfg, [&](const Coord& c) { bitmask_thread<T, decltype(vec)::value, decltype(unroll)::value>(p, c); });
  });
  check("grid", cfg);

  // The chunk kernel, lazy and eager, wherever it could run (aligned rows), whether or not
  // the launcher would pick it for this shape on this many SMs.
  const BitmaskChunkConfig chunk = bitmask_chunk_config(p, ft, 1 << 30);
  if (!chunk.use) return;
  constexpr int kVec = 16 / sizeof(T);
  auto run_chunks = [&](auto u, auto indices, auto eager) {
    constexpr int U = decltype(u)::value;
    for (int64_t i = 0; i < chunk.rows; ++i)
      for (int bx = 0; bx < ceil_div(ceil_div(p.vocab, kVec), int64_t{U} * kBlock); ++bx)
        for (int tx = 0; tx < kBlock; ++tx)
          bitmask_chunk_thread<T, kVec, U, decltype(indices)::value, decltype(eager)::value>(p, i, bx, tx);
    LaunchConfig shown;
    shown.vec = kVec;
    shown.unroll = U;
    check(decltype(eager)::value ? "chunk-eager" : "chunk-lazy", shown);
  };
  auto both_index_modes = [&](auto u, auto eager) {
    if (index_mode) run_chunks(u, std::true_type{}, eager);
    else run_chunks(u, std::false_type{}, eager);
  };
  both_index_modes(IntTag<1>{}, std::false_type{});
  both_index_modes(IntTag<1>{}, std::true_type{});
  both_index_modes(IntTag<2>{}, std::false_type{});
  both_index_modes(IntTag<2>{}, std::true_type{});
}

// Which bitmask kernel the launcher picks, on the H200's 132 SMs, and its grid.
void test_bitmask_kernel_choice() {
  constexpr FloatType f32 = FloatType::kFloat32, b16 = FloatType::kBFloat16;
  static const int32_t some_indices[1] = {0};
  struct Case {
    int64_t n, valid_rows, vocab, stride;
    bool indices;
    FloatType ft;
    bool chunk;
    int per_thread;
    bool eager;
    int64_t grid_x, rows;
  } cases[] = {
      //  n  valid  vocab   stride  idx   ft   chunk per eager grid_x rows
      {1, 1, 128256, 128256, false, f32, true, 2, true, 63, 1},       // 32064 chunks, 512 a block
      {1, 1, 128256, 128256, false, b16, true, 1, true, 63, 1},       // 16032 chunks, 256 a block
      {8, 8, 151936, 151936, false, f32, true, 2, true, 75, 8},       // 4.6 MiB: eager
      {32, 32, 128256, 128256, false, b16, true, 2, false, 32, 32},   // 7.8 MiB: lazy
      {32, 32, 128256, 128256, false, f32, true, 2, false, 63, 32},
      {512, 512, 151936, 151936, false, f32, true, 2, false, 75, 512},
      {7, 4, 1000, 1000, false, f32, true, 1, true, 1, 4},            // no indices: rows past valid_rows dropped
      {9, 4, 1000, 1000, true, f32, true, 1, true, 1, 9},             // indices: every entry gets a block row
      {4, 4, 128256, 128257, false, f32, false, 1, false, 0, 0},      // rows not 16-byte aligned: grid kernel
      {70000, 70000, 64, 64, false, f32, false, 1, false, 0, 0},      // more rows than gridDim.y: grid kernel
  };
  for (const Case& c : cases) {
    BitmaskParams p{};
    p.logits = reinterpret_cast<void*>(uintptr_t{1} << 20);
    p.logits_stride = c.stride;
    p.n = c.n;
    p.valid_rows = c.valid_rows;
    p.indices = c.indices ? some_indices : nullptr;
    p.vocab = c.vocab;
    const BitmaskChunkConfig cfg = bitmask_chunk_config(p, c.ft, 132);
    EXPECT(cfg.use == c.chunk &&
               (!c.chunk || (cfg.per_thread == c.per_thread && cfg.eager == c.eager && cfg.grid_x == c.grid_x &&
                             cfg.rows == c.rows)),
           "bitmask kernel choice n=%lld vocab=%lld: chunk %d per_thread %d eager %d grid_x %lld rows %lld",
           (long long)c.n, (long long)c.vocab, cfg.use, cfg.per_thread, cfg.eager, (long long)cfg.grid_x,
           (long long)cfg.rows);
  }
}

// ---------------- penalties ----------------
template <typename T>
void test_penalties(bool fused, int64_t rows, int64_t vocab, int64_t pad, int64_t offset, int num_sms) {
  const int64_t ls = vocab + pad;
  Buf<T> logits(rows * ls, offset);
  Buf<bool> prompt(rows * ls), omask(rows * ls);
  Buf<int32_t> counts(rows * ls);
  std::vector<float> rep(rows), freq(rows), pres(rows);
  for (int64_t i = 0; i < rows * ls; ++i) {
    logits.ptr[i] = random_logit<T>();
    prompt.ptr[i] = rng() % 3 == 0;
    omask.ptr[i] = rng() % 4 == 0;
    counts.ptr[i] = rng() % 3 == 0 ? static_cast<int32_t>(rng() % 5) : 0;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int kind = rng() % 4;  // some rows neutral, some repetition only
    rep[r] = kind == 0 ? 1.0f : 0.5f + (rng() % 100) / 50.0f;
    freq[r] = kind <= 1 ? 0.0f : (rng() % 100) / 100.0f - 0.3f;
    pres[r] = kind <= 1 ? 0.0f : (rng() % 100) / 50.0f - 0.5f;
  }
  std::vector<T> ref(logits.ptr, logits.ptr + rows * ls);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < vocab; ++j) {
      const int64_t k = r * ls + j;
      const float x = to_float(ref[k]);
      const float y = fused ? penalize(x, prompt.ptr[k], counts.ptr[k], rep[r], freq[r], pres[r])
                            : repetition_penalize(x, prompt.ptr[k] || omask.ptr[k], rep[r]);
      ref[k] = from_float<T>(y);
    }
  PenaltyParams p{};
  p.logits = logits.ptr;
  p.logits_stride = ls;
  p.prompt_mask = prompt.ptr;
  p.prompt_stride = ls;
  if (fused) {
    p.output_counts = counts.ptr;
    p.counts_stride = ls;
    p.frequency = freq.data();
    p.presence = pres.data();
  } else {
    p.output_mask = omask.ptr;
    p.output_stride = ls;
  }
  p.repetition = rep.data();
  p.rows = rows;
  p.vocab = vocab;
  const FloatType ft = sizeof(T) == 4 ? FloatType::kFloat32
                       : std::is_same<T, __half>::value ? FloatType::kFloat16 : FloatType::kBFloat16;
  const LaunchConfig cfg = penalty_config(p, ft, num_sms);
  with_vec_unroll<T, penalty_vec_unroll(sizeof(T))>(cfg, [&](auto vec, auto unroll) {
    constexpr int V = decltype(vec)::value, U = decltype(unroll)::value;
    run_grid(cfg, [&](const Coord& c) {
      if (fused) penalty_thread<T, V, U, true>(p, c);
      else penalty_thread<T, V, U, false>(p, c);
    });
  });
  const bool same = std::memcmp(ref.data(), logits.ptr, ref.size() * sizeof(T)) == 0;
  EXPECT(same, "penalties %s fused=%d rows=%lld vocab=%lld pad=%lld off=%lld sms=%d (vec=%d unroll=%d)",
         type_name<T>(), fused, (long long)rows, (long long)vocab, (long long)pad, (long long)offset, num_sms,
         cfg.vec, cfg.unroll);
}

// ---------------- bincount ----------------
void test_bincount(int64_t rows, int64_t max_len, int64_t vocab, bool int64_ids) {
  const int64_t stride = max_len + 3;
  std::vector<int64_t> ids64(rows * stride);
  for (auto& t : ids64) t = static_cast<int64_t>(rng() % (vocab + 3)) - 1;  // -1 and vocab, vocab+1 are padding
  std::vector<int32_t> ids32(ids64.begin(), ids64.end());
  std::vector<int32_t> counts(rows * vocab, 7), ref(rows * vocab, 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < max_len; ++j) {
      const int64_t t = ids64[r * stride + j];
      if (t >= 0 && t < vocab) ++ref[r * vocab + t];
    }
  BincountParams p{};
  p.token_ids = int64_ids ? static_cast<const void*>(ids64.data()) : ids32.data();
  p.ids_int64 = int64_ids;
  p.ids_stride = stride;
  p.rows = rows;
  p.max_len = max_len;
  p.counts = counts.data();
  p.vocab = vocab;
  std::fill(counts.begin(), counts.end(), 0);  // the launcher's cudaMemsetAsync
  const LaunchConfig cfg = bincount_config(p);
  run_grid(cfg, [&](const Coord& c) { bincount_thread(p, c); });
  EXPECT(counts == ref, "bincount rows=%lld max_len=%lld vocab=%lld int64=%d", (long long)rows, (long long)max_len,
         (long long)vocab, int64_ids);
}

void test_bincount_update(int64_t rows, int64_t vocab, int64_t n, bool req64, bool tok64) {
  const int64_t cs = vocab + 5;
  std::vector<int32_t> counts(rows * cs, 0), ref;
  for (auto& c : counts) c = rng() % 4;
  ref = counts;
  std::vector<int64_t> req(n), tok(n);
  for (int64_t i = 0; i < n; ++i) {
    req[i] = static_cast<int64_t>(rng() % (rows + 2)) - 1;
    tok[i] = static_cast<int64_t>(rng() % 4 == 0 ? 3 : rng() % (vocab + 2)) - 1;  // duplicates too
    if (req[i] >= 0 && req[i] < rows && tok[i] >= 0 && tok[i] < vocab) ++ref[req[i] * cs + tok[i]];
  }
  std::vector<int32_t> req32(req.begin(), req.end()), tok32(tok.begin(), tok.end());
  BincountUpdateParams p{};
  p.counts = counts.data();
  p.counts_stride = cs;
  p.rows = rows;
  p.vocab = vocab;
  p.req_indices = req64 ? static_cast<const void*>(req.data()) : req32.data();
  p.req_int64 = req64;
  p.token_ids = tok64 ? static_cast<const void*>(tok.data()) : tok32.data();
  p.tok_int64 = tok64;
  p.n = n;
  const LaunchConfig cfg = bincount_update_config(p);
  run_grid(cfg, [&](const Coord& c) { bincount_update_thread(p, c); });
  EXPECT(counts == ref, "bincount_update rows=%lld vocab=%lld n=%lld", (long long)rows, (long long)vocab, (long long)n);
}

template <typename T>
void bitmask_suite() {
  constexpr int64_t h = 16 / sizeof(T);  // logits in 16 bytes (half a sector)
  test_bitmask<T>(1, 128256, 0, 1, 4008, 0, 0, 132);   // batch 1, vector path, unroll 1, narrow blocks
  test_bitmask<T>(40, 4096, 0, 40, 128, 0, 0, 1);      // unrolled
  test_bitmask<T>(66000, 8, 0, 66000, 1, 0, 0, 132);   // more rows than gridDim.y
  // Every layout twice: 132 SMs (small grids: one access per thread) and 1 SM (unrolled).
  for (int sms : {132, 1}) {
    //           logits_rows cols  pad bitmask_rows words idx off
    test_bitmask<T>(3, 50021, 0, 3, 1564, 0, 0, sms);    // prime vocab, unaligned rows: scalar path
    test_bitmask<T>(1, 50021, 0, 1, 1564, 0, 0, sms);    // one row: vector path (stride unused), cut last chunk
    test_bitmask<T>(5, 32064, 64, 5, 1000, 0, 0, sms);   // logits wider than the bitmask, strided rows
    test_bitmask<T>(4, 100, 0, 4, 5, 0, 0, sms);         // bitmask wider than logits
    test_bitmask<T>(6, 17, 0, 6, 1, 0, 0, sms);          // vocab 17
    test_bitmask<T>(9, 1024, 0, 12, 32, 1, 0, sms);      // int32 indices (duplicates), more bitmask rows
    test_bitmask<T>(12, 1000, 8, 9, 32, 2, 0, sms);      // int64 indices, fewer bitmask rows
    test_bitmask<T>(7, 1000, 0, 4, 32, 0, 0, sms);       // fewer bitmask rows, no indices: rows 4.. untouched
    test_bitmask<T>(3, 1024, 0, 3, 32, 0, 1, sms);       // misaligned base: scalar path
    test_bitmask<T>(6, 1024, 0, 6, 32, 0, h, sms);       // rows start mid-sector: partner is the chunk before
    test_bitmask<T>(6, 5000, 0, 6, 157, 0, h, sms);      // ... over several unrolled blocks per row
    test_bitmask<T>(6, 1024, h, 6, 32, 0, 0, sms);       // stride 16 mod 32 bytes: rows alternate
    test_bitmask<T>(5, 1000, 0, 5, 32, 0, 0, sms);       // vocab 1000 (not a multiple of 32), bits past it
    test_bitmask<T>(4, 1001, 7, 4, 32, 0, 0, sms);       // vocab 1001 on aligned rows: cut last chunk
    test_bitmask<T>(4, 1004, 4, 4, 32, 2, 0, sms);       // vocab 1004: partner past the row end (fp32)
    test_bitmask<T>(300, 40, 0, 300, 2, 0, 0, sms);      // many short rows: every sector kind at a row end
    test_bitmask<T>(300, 37, 3, 300, 2, 0, 0, sms);      // ... with a cut last chunk
    test_bitmask<T>(300, 44, 4, 300, 2, 1, h, sms);      // ... rows starting mid-sector, indices
    test_bitmask<T>(0, 1024, 0, 0, 32, 0, 0, sms);       // empty batch
  }
}

template <typename T>
void penalties_suite() {
  for (bool fused : {true, false}) {
    test_penalties<T>(fused, 1, 128256, 0, 0, 132);
    test_penalties<T>(fused, 33, 4096, 0, 0, 1);     // unrolled vector path (16 logits per thread)
    test_penalties<T>(fused, 40, 5000, 8, 0, 1);     // ... strided rows, a block cut by the vocab
    test_penalties<T>(fused, 40, 5000, 4, 0, 1);     // stride 4 mod 8 logits: 16-bit rows take the scalar path
    test_penalties<T>(fused, 5, 50021, 0, 0, 132);
    test_penalties<T>(fused, 4, 1000, 24, 0, 1);
    test_penalties<T>(fused, 3, 1024, 0, 1, 132);
    test_penalties<T>(fused, 7, 17, 0, 0, 132);
    test_penalties<T>(fused, 0, 64, 0, 0, 132);
    test_penalties<T>(fused, 66000, 8, 0, 0, 132);
  }
}

int main() {
  test_bitmask_kernel_choice();
  bitmask_suite<float>();
  bitmask_suite<__nv_bfloat16>();
  bitmask_suite<__half>();
  penalties_suite<float>();
  penalties_suite<__nv_bfloat16>();
  penalties_suite<__half>();
  for (bool i64 : {false, true}) {
    test_bincount(3, 1000, 50021, i64);
    test_bincount(70000, 3, 17, i64);
    test_bincount(2, 300, 5, i64);
    test_bincount(5, 1, 100, i64);
    test_bincount(0, 10, 100, i64);
    test_bincount(4, 0, 100, i64);
  }
  test_bincount_update(5, 1000, 3000, false, true);
  test_bincount_update(1, 17, 1, true, false);
  test_bincount_update(64, 50021, 100000, true, true);
  test_bincount_update(3, 10, 0, false, false);
  if (g_failures) {
    std::printf("emulate_kernels: %d failure(s)\n", g_failures);
    return 1;
  }
  std::printf("emulate_kernels: all kernel bodies match the reference loops\n");
  return 0;
}
