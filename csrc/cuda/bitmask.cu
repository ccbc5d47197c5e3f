// Grammar bitmask apply kernels and their launcher (no torch: see launch.cuh).
#include "cuda/bitmask_kernels.cuh"

namespace specops {

// At most 32 registers: 8 blocks (2048 threads, the most an SM holds) per SM, each thread with
// kBitmaskUnroll chunks. Measured on the H200 (grammar masks, fp32 V=128256 B=512): 87.6 us,
// against 105.6 with 4 chunks and 4 blocks per SM; 4 chunks within 32 registers spill.
template <typename T, int VEC, int UNROLL>
__global__ void __launch_bounds__(kBlock, 8) apply_token_bitmask_kernel(const BitmaskParams p) {
  bitmask_thread<T, VEC, UNROLL>(p, Coord::here());
}

template <typename T, int VEC, int U, bool INDICES, bool EAGER>
__global__ void __launch_bounds__(kBlock) apply_token_bitmask_chunk_kernel(const BitmaskParams p) {
  bitmask_chunk_thread<T, VEC, U, INDICES, EAGER>(p, blockIdx.y, blockIdx.x, threadIdx.x);
}

template <typename T, int U>
void launch_chunk_kernel(const BitmaskParams& p, const BitmaskChunkConfig& cfg, cudaStream_t stream) {
  constexpr int VEC = 16 / sizeof(T);
  const dim3 grid(static_cast<unsigned>(cfg.grid_x), static_cast<unsigned>(cfg.rows));
  const bool indices = p.indices != nullptr;
  if (indices && cfg.eager) apply_token_bitmask_chunk_kernel<T, VEC, U, true, true><<<grid, kBlock, 0, stream>>>(p);
  else if (indices) apply_token_bitmask_chunk_kernel<T, VEC, U, true, false><<<grid, kBlock, 0, stream>>>(p);
  else if (cfg.eager) apply_token_bitmask_chunk_kernel<T, VEC, U, false, true><<<grid, kBlock, 0, stream>>>(p);
  else apply_token_bitmask_chunk_kernel<T, VEC, U, false, false><<<grid, kBlock, 0, stream>>>(p);
}

cudaError_t launch_apply_token_bitmask(const BitmaskParams& p, FloatType dtype, int num_sms,
                                       cudaStream_t stream) {
  if (p.vocab >= (int64_t{1} << 31) - (1 << 20)) return cudaErrorInvalidValue;  // in-row offsets are int
  const BitmaskChunkConfig chunk_cfg = bitmask_chunk_config(p, dtype, num_sms);
  if (chunk_cfg.use) {
    with_float_type(dtype, [&](auto t) {
      using T = typename decltype(t)::type;
      if (chunk_cfg.per_thread == 2) launch_chunk_kernel<T, 2>(p, chunk_cfg, stream);
      else launch_chunk_kernel<T, 1>(p, chunk_cfg, stream);
    });
    return cudaGetLastError();
  }
  const LaunchConfig cfg = bitmask_config(p, dtype, num_sms);
  if (cfg.empty()) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(cfg.grid_x), static_cast<unsigned>(cfg.grid_y));
  with_float_type(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    with_vec_unroll<T, kBitmaskUnroll>(cfg, [&](auto vec, auto unroll) {
      apply_token_bitmask_kernel<T, decltype(vec)::value, decltype(unroll)::value><<<grid, cfg.block, 0, stream>>>(p);
    });
  });
  return cudaGetLastError();
}

}  // namespace specops
