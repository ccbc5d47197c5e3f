// Experiment: the grammar bitmask kernels timed against each other in one process on the
// GPU (no torch): the launcher (what specops runs), each of its two kernels forced (the grid
// kernel, the chunk kernel lazy and eager), and xgrammar's CUDA scheme (one 16-byte chunk per
// thread, 256 threads, no tail handling: here only to place the peer on the same clock).
// Session 10 also measured, and dropped: a software-pipelined grid-stride kernel (1.2-1.5x
// slower everywhere), 2 or 4 chunks per thread without sector planning, 128-thread blocks,
// and a row loop in the chunk kernel (+0.1 us at batch 1): logs/exp_bitmask_2026-11-30*.txt.
// Session 14 dropped partial stores (a mixed chunk never read, only its disallowed logits
// stored, the DRAM merging the sector): 1.5-2.5x slower at B >= 128, logs/exp_bitmask_2026-11-30g.txt.
// Session 16 added the chunk kernel at 4 and 8 chunks per thread. With grammar masks from B=32, x4 lazy
// is 0.5-4% slower than the launcher and x8 lazy between 2% faster (bf16 B=32) and 11% slower; random
// masks: x4 up to 9% faster at bf16 V=151936 B=32 only. Slower at B <= 8: logs/exp_bitmask_2026-12-01.txt.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -Icsrc --expt-relaxed-constexpr bench/exp_bitmask.cu -o /tmp/exp_bitmask
//   /tmp/exp_bitmask [reps]
//
// Every variant's output is compared bit for bit with a one-logit-per-thread reference
// before it is timed. Timing: CUDA graph of 10 launches, median of 100 replays, per launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/bitmask.cu"

using namespace specops;

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);    \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// ------------------------------------------------------------------ one chunk per thread
// xgrammar's scheme (its CUDA kernel): 256 threads, one 16-byte chunk per thread, no sector
// planning; a block covers 256 * max(VEC, 4) logits of one row.
template <typename T, int VEC, int PER_THREAD>
__global__ void __launch_bounds__(256) one_chunk_kernel(T* logits, const int32_t* bitmask, int vocab, int64_t stride,
                                                       int64_t bstride) {
  const int row = blockIdx.y;
  T* lrow = logits + row * stride;
  const int32_t* brow = bitmask + row * bstride;
  const int base = blockIdx.x * 256 * PER_THREAD;
#pragma unroll
  for (int off = threadIdx.x * VEC; off < 256 * PER_THREAD; off += 256 * VEC) {
    const int e = base + off;
    if (e >= vocab) break;
    const uint32_t bits = bits_at<VEC>(brow, e);
    constexpr uint32_t kAll = (1u << VEC) - 1u;
    if (bits == kAll) continue;
    Vec<uint32_t, 4> v, out;
    if (bits != 0) v = load_vec<uint32_t, 4>(reinterpret_cast<const uint32_t*>(lrow + e));
#pragma unroll
    for (int k = 0; k < 4; ++k) out.v[k] = bits == 0 ? neg_inf_word<T>() : select_word<T>(v.v[k], bits, k);
    store_vec<uint32_t, 4>(reinterpret_cast<uint32_t*>(lrow + e), out);
  }
}



// ------------------------------------------------------------------ reference, fill, compare
template <typename T>
__global__ void reference_kernel(T* logits, const int32_t* bitmask, int64_t rows, int vocab, int words) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * vocab) return;
  const int64_t r = i / vocab;
  const int j = static_cast<int>(i % vocab);
  if (!((static_cast<uint32_t>(bitmask[r * words + j / 32]) >> (j % 32)) & 1u)) logits[i] = from_float<T>(-INFINITY);
}

__global__ void fill_kernel(uint4* p, int64_t n, uint32_t word) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = make_uint4(word, word, word, word);
}

__global__ void count_diff(const uint32_t* a, const uint32_t* b, int64_t n, unsigned long long* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    if (a[i] != b[i]) atomicAdd(out, 1ull);
}

template <typename F>
double time_us(F&& launch, int reps) {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < 10; ++k) launch(s);
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int k = 0; k < 3; ++k) CHECK(cudaGraphLaunch(exec, s));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int k = 0; k < reps; ++k) {
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(s));
  return t[t.size() / 2] * 1000.0 / 10.0;
}

// One variant: launches the op on the given stream.
struct Variant {
  std::string name;
  std::function<void(const BitmaskParams&, cudaStream_t)> run;
};

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 100;
  int dev = 0, num_sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device %s, %d SMs\n", prop.name, num_sms);

  const int64_t max_bytes = int64_t{512} * 151936 * 4;
  void *work, *pristine, *ref;
  int32_t* bitmask;
  unsigned long long* diff;
  CHECK(cudaMalloc(&work, max_bytes));
  CHECK(cudaMalloc(&pristine, max_bytes));
  CHECK(cudaMalloc(&ref, max_bytes));
  CHECK(cudaMalloc(&bitmask, int64_t{512} * 4748 * 4));
  CHECK(cudaMalloc(&diff, sizeof(unsigned long long)));

  // copy bandwidth (bytes read + written, as bench.common measures it)
  double copy_bw;
  {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaMemcpy(ref, pristine, max_bytes, cudaMemcpyDeviceToDevice));
    std::vector<float> t;
    for (int k = 0; k < 20; ++k) {
      CHECK(cudaEventRecord(a));
      CHECK(cudaMemcpyAsync(ref, pristine, max_bytes, cudaMemcpyDeviceToDevice));
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    copy_bw = 2.0 * max_bytes / (t[t.size() / 2] * 1e-3);
    std::printf("copy bandwidth %.2f TB/s\n", copy_bw / 1e12);
  }

  std::mt19937_64 rng(7);
  std::vector<int> batches = {1, 8, 32, 128, 512};
  std::vector<int64_t> vocabs = {128256, 151936};
  std::printf("| dtype | V | B | mask | variant | us | x floor | x launcher |\n|---|---|---|---|---|---|---|---|\n");
  for (int dt = 0; dt < 2; ++dt) {
    const FloatType ft = dt == 0 ? FloatType::kFloat32 : FloatType::kBFloat16;
    const int esz = dt == 0 ? 4 : 2;
    for (int64_t V : vocabs) {
      for (int B : batches) {
        for (int m = 0; m < 2; ++m) {
          const double p_allowed = m == 0 ? 0.01 : 0.5;
          const int words = static_cast<int>((V + 31) / 32);
          std::vector<int32_t> hb(int64_t{B} * words);
          std::bernoulli_distribution bern(p_allowed);
          int64_t disallowed_sectors = 0, mixed_sectors = 0;
          const int per_sector = 32 / esz;
          std::vector<uint8_t> allowed(V);
          for (int r = 0; r < B; ++r) {
            for (int j = 0; j < words * 32; ++j) {
              const bool a = bern(rng);
              if (j < V) allowed[j] = a;
              if (a) hb[int64_t{r} * words + j / 32] |= static_cast<int32_t>(1u << (j % 32));
            }
            for (int64_t s = 0; s < V / per_sector; ++s) {
              int c = 0;
              for (int j = 0; j < per_sector; ++j) c += allowed[s * per_sector + j];
              if (c == 0) ++disallowed_sectors;
              else if (c < per_sector) ++mixed_sectors;
            }
          }
          CHECK(cudaMemcpy(bitmask, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
          const int64_t bytes = int64_t{B} * V * esz;
          const double floor_us =
              (hb.size() * 4.0 + 32.0 * disallowed_sectors + 64.0 * mixed_sectors) / copy_bw * 1e6;
          // pristine logits: random bits that are finite floats of either width
          {
            std::vector<uint16_t> h(bytes / 2);
            std::uniform_int_distribution<int> u(0, 0x3FFF);
            for (auto& x : h) x = static_cast<uint16_t>(u(rng));
            CHECK(cudaMemcpy(pristine, h.data(), bytes, cudaMemcpyHostToDevice));
          }
          CHECK(cudaMemcpy(ref, pristine, bytes, cudaMemcpyDeviceToDevice));
          const int64_t total = int64_t{B} * V;
          if (dt == 0)
            reference_kernel<float><<<ceil_div(total, 256), 256>>>(static_cast<float*>(ref), bitmask, B, V, words);
          else
            reference_kernel<__nv_bfloat16>
                <<<ceil_div(total, 256), 256>>>(static_cast<__nv_bfloat16*>(ref), bitmask, B, V, words);
          CHECK(cudaDeviceSynchronize());

          BitmaskParams p{};
          p.logits = work;
          p.logits_stride = V;
          p.bitmask = bitmask;
          p.bitmask_stride = words;
          p.indices = nullptr;
          p.n = B;
          p.valid_rows = B;
          p.vocab = V;

          std::vector<Variant> vs;
          vs.push_back({"launcher", [&](const BitmaskParams& q, cudaStream_t s) {
                          CHECK(launch_apply_token_bitmask(q, ft, num_sms, s));
                        }});
          auto typed = [&](auto tag) {
            using T = typename decltype(tag)::type;
            constexpr int VEC = 16 / sizeof(T);
            vs.push_back({"grid kernel", [&](const BitmaskParams& q, cudaStream_t s) {
                            const LaunchConfig cfg = bitmask_config(q, ft, num_sms);
                            with_vec_unroll<T, kBitmaskUnroll>(cfg, [&](auto vec, auto unroll) {
                              apply_token_bitmask_kernel<T, decltype(vec)::value, decltype(unroll)::value>
                                  <<<dim3(cfg.grid_x, cfg.grid_y), cfg.block, 0, s>>>(q);
                            });
                          }});
            auto chunk = [&](auto u_tag) {
              constexpr int U = decltype(u_tag)::value;
              for (bool eager : {false, true}) {
                vs.push_back({"chunk kernel x" + std::to_string(U) + (eager ? ", eager" : ", lazy"),
                              [&, eager](const BitmaskParams& q, cudaStream_t s) {
                                BitmaskChunkConfig cfg = bitmask_chunk_config(q, ft, num_sms);
                                cfg.eager = eager;
                                cfg.per_thread = U;
                                cfg.grid_x = ceil_div(ceil_div(q.vocab, VEC), int64_t{kBlock} * U);
                                launch_chunk_kernel<T, U>(q, cfg, s);
                              }});
              }
            };
            chunk(IntTag<1>{});
            chunk(IntTag<2>{});
            chunk(IntTag<4>{});
            chunk(IntTag<8>{});
            vs.push_back({"xgrammar scheme", [&](const BitmaskParams& q, cudaStream_t s) {
                            constexpr int PER = VEC < 4 ? 4 : VEC;
                            one_chunk_kernel<T, VEC, PER><<<dim3(ceil_div(q.vocab, 256 * PER), q.n), 256, 0, s>>>(
                                static_cast<T*>(q.logits), q.bitmask, static_cast<int>(q.vocab), q.logits_stride,
                                q.bitmask_stride);
                          }});
          };
          if (dt == 0) typed(TypeTag<float>{});
          else typed(TypeTag<__nv_bfloat16>{});

          double main_us = 0;
          for (auto& var : vs) {
            CHECK(cudaMemcpy(work, pristine, bytes, cudaMemcpyDeviceToDevice));
            var.run(p, 0);
            CHECK(cudaGetLastError());
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaMemset(diff, 0, sizeof(unsigned long long)));
            count_diff<<<1024, 256>>>(static_cast<const uint32_t*>(work), static_cast<const uint32_t*>(ref), bytes / 4,
                                      diff);
            unsigned long long nd = 0;
            CHECK(cudaMemcpy(&nd, diff, sizeof(nd), cudaMemcpyDeviceToHost));
            if (nd != 0) {
              std::printf("| %s | %lld | %d | %s | %s | WRONG (%llu words differ) | | |\n", dt ? "bf16" : "fp32",
                          (long long)V, B, m ? "random" : "grammar", var.name.c_str(), nd);
              continue;
            }
            const double us = time_us([&](cudaStream_t s) { var.run(p, s); }, reps);
            if (var.name == "launcher") main_us = us;
            std::printf("| %s | %lld | %d | %s | %s | %.2f | %.2f | %.3f |\n", dt ? "bf16" : "fp32", (long long)V, B,
                        m ? "random" : "grammar", var.name.c_str(), us, us / floor_us, us / main_us);
          }
          const double fill_us = time_us(
              [&](cudaStream_t s) {
                fill_kernel<<<num_sms * 8, 256, 0, s>>>(static_cast<uint4*>(work), bytes / 16, 0xFF800000u);
              },
              reps);
          std::printf("| %s | %lld | %d | %s | fill | %.2f | %.2f | %.3f |\n", dt ? "bf16" : "fp32", (long long)V, B,
                      m ? "random" : "grammar", fill_us, fill_us / floor_us, fill_us / main_us);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
