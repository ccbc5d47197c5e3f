// Device helpers shared by the kernel files. The per-thread kernel bodies are
// __host__ __device__ so that csrc/emulate/ can run them on the CPU, thread by thread,
// with the very launch configuration the launchers use.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/launch.cuh"

#ifndef SPECOPS_HD
#define SPECOPS_HD __host__ __device__ __forceinline__
#endif

namespace specops {

// Where one thread sits in the grid; Coord::here() on the device, a loop in the emulator.
struct Coord {
  int64_t bx, by, tx, gx, gy, bdim;
#if defined(__CUDACC__)
  __device__ static Coord here() {
    return {blockIdx.x, blockIdx.y, threadIdx.x, gridDim.x, gridDim.y, blockDim.x};
  }
#endif
};

struct LaunchConfig {
  int vec = 1;             // elements per thread access (16 bytes of logits, or 1)
  int unroll = 1;          // accesses per thread, issued together
  int block = 256;         // threads per block
  int64_t grid_x = 0;      // blocks along a row
  int64_t grid_y = 0;      // blocks across rows (rows loop with stride grid_y)
  bool empty() const { return grid_x == 0 || grid_y == 0; }
};

constexpr int64_t kMaxGridY = 65535;
constexpr int kBlock = 256;
constexpr int kUnroll = 4;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool aligned(const void* p, int64_t stride_bytes, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0 && stride_bytes % bytes == 0;
}

// Grid over (rows, groups of `vec` elements): `unroll` groups per thread once there are
// enough blocks to fill the GPU twice over, one otherwise, so that batch 1 still spreads
// over many SMs while large batches issue several loads per thread.
inline LaunchConfig row_chunk_config(int64_t rows, int64_t vocab, int vec, int unroll, int num_sms) {
  LaunchConfig cfg;
  cfg.vec = vec;
  if (rows <= 0 || vocab <= 0) return cfg;
  const int64_t groups = ceil_div(vocab, vec);
  cfg.unroll = rows * ceil_div(groups, int64_t{kBlock} * unroll) >= 2 * int64_t{num_sms} ? unroll : 1;
  cfg.grid_x = ceil_div(groups, int64_t{kBlock} * cfg.unroll);
  cfg.grid_y = rows < kMaxGridY ? rows : kMaxGridY;
  return cfg;
}

template <typename T>
struct TypeTag {
  using type = T;
};
template <int N>
using IntTag = std::integral_constant<int, N>;

template <typename F>
void with_float_type(FloatType t, F&& f) {
  switch (t) {
    case FloatType::kFloat32: f(TypeTag<float>{}); break;
    case FloatType::kBFloat16: f(TypeTag<__nv_bfloat16>{}); break;
    case FloatType::kFloat16: f(TypeTag<__half>{}); break;
  }
}

// Calls f(IntTag<VEC>, IntTag<UNROLL>) for the configuration's vector width (1 or the
// 16-byte width of T) and unroll: 1, or kVecUnroll on the vector path and kUnroll on the
// scalar path (the values the kernel's config function chose from).
template <typename T, int kVecUnroll = kUnroll, typename F>
void with_vec_unroll(const LaunchConfig& cfg, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = cfg.vec != 1, unroll = cfg.unroll != 1;
  if (vec && unroll) f(IntTag<kVec>{}, IntTag<kVecUnroll>{});
  else if (vec) f(IntTag<kVec>{}, IntTag<1>{});
  else if (unroll) f(IntTag<1>{}, IntTag<kUnroll>{});
  else f(IntTag<1>{}, IntTag<1>{});
}

inline int float_size(FloatType t) { return t == FloatType::kFloat32 ? 4 : 2; }

SPECOPS_HD float to_float(float x) { return x; }
SPECOPS_HD float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
SPECOPS_HD float to_float(__half x) { return __half2float(x); }

template <typename T>
SPECOPS_HD T from_float(float x);
template <>
SPECOPS_HD float from_float<float>(float x) { return x; }
template <>
SPECOPS_HD __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
SPECOPS_HD __half from_float<__half>(float x) { return __float2half_rn(x); }

// N elements moved as one access (up to 16 bytes: wider vectors become several accesses).
template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Vec {
  T v[N];
};

template <typename T, int N>
SPECOPS_HD Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}
template <typename T, int N>
SPECOPS_HD void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

SPECOPS_HD void atomic_increment(int32_t* p) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, 1);
#else
  ++*p;  // the emulator runs threads one after another
#endif
}

SPECOPS_HD int64_t load_index(const void* p, bool is_int64, int64_t i) {
  return is_int64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

}  // namespace specops
