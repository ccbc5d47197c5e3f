// Token histogram kernels and their launchers (no torch: see launch.cuh).
#include "cuda/bincount_kernels.cuh"

namespace specops {

__global__ void __launch_bounds__(kBlock) token_bincount_kernel(const BincountParams p) {
  bincount_thread(p, Coord::here());
}

__global__ void __launch_bounds__(kBlock) token_bincount_update_kernel(const BincountUpdateParams p) {
  bincount_update_thread(p, Coord::here());
}

cudaError_t launch_token_bincount(const BincountParams& p, cudaStream_t stream) {
  if (p.rows > 0 && p.vocab > 0) {
    const cudaError_t err = cudaMemsetAsync(p.counts, 0, sizeof(int32_t) * p.rows * p.vocab, stream);
    if (err != cudaSuccess) return err;
  }
  const LaunchConfig cfg = bincount_config(p);
  if (cfg.empty()) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(cfg.grid_x), static_cast<unsigned>(cfg.grid_y));
  token_bincount_kernel<<<grid, cfg.block, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_token_bincount_update(const BincountUpdateParams& p, cudaStream_t stream) {
  const LaunchConfig cfg = bincount_update_config(p);
  if (cfg.empty()) return cudaSuccess;
  token_bincount_update_kernel<<<static_cast<unsigned>(cfg.grid_x), cfg.block, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace specops
