// Small helpers for the CUDA bindings (host code, includes torch).
#pragma once
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <atomic>

#include "cuda/launch.cuh"

namespace specops {

inline FloatType float_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return FloatType::kFloat32;
    case at::kBFloat16: return FloatType::kBFloat16;
    case at::kHalf: return FloatType::kFloat16;
    default: TORCH_CHECK_TYPE(false, "specops: unsupported logits dtype ", c10::toString(t.scalar_type()));
  }
}

inline void check_cuda(const char* op, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.is_cuda(), op, ": expected CUDA tensors, got ", t.device().str());
}

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// Multiprocessor count of the current device, queried once per device.
inline int num_sms() {
  static std::array<std::atomic<int>, 64> cache{};
  const int dev = c10::cuda::current_device();
  if (dev < 0 || dev >= static_cast<int>(cache.size())) return 132;
  int n = cache[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    cache[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

inline void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "specops::", op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace specops
