// Penalty kernels and their launcher (no torch: see launch.cuh).
#include "cuda/penalties_kernels.cuh"

namespace specops {

// Fused: at most 64 registers, 4 blocks (1024 threads) per SM; repetition only (fewer
// inputs): at most 48, 5 blocks. No spills either way (ptxas -v); see penalties_kernels.cuh.
template <typename T, int VEC, int UNROLL, bool FUSED>
__global__ void __launch_bounds__(kBlock, FUSED ? 4 : 5) apply_penalties_kernel(const PenaltyParams p) {
  penalty_thread<T, VEC, UNROLL, FUSED>(p, Coord::here());
}

cudaError_t launch_apply_penalties(const PenaltyParams& p, FloatType dtype, int num_sms, cudaStream_t stream) {
  if (p.vocab >= (int64_t{1} << 31) - (1 << 20)) return cudaErrorInvalidValue;  // in-row offsets are int
  const LaunchConfig cfg = penalty_config(p, dtype, num_sms);
  if (cfg.empty()) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(cfg.grid_x), static_cast<unsigned>(cfg.grid_y));
  const bool fused = p.output_counts != nullptr;
  with_float_type(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    with_vec_unroll<T, penalty_vec_unroll(sizeof(T))>(cfg, [&](auto vec, auto unroll) {
      constexpr int V = decltype(vec)::value, U = decltype(unroll)::value;
      if (fused) apply_penalties_kernel<T, V, U, true><<<grid, cfg.block, 0, stream>>>(p);
      else apply_penalties_kernel<T, V, U, false><<<grid, cfg.block, 0, stream>>>(p);
    });
  });
  return cudaGetLastError();
}

}  // namespace specops
