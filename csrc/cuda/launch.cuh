// What the torch bindings need to call the kernels: plain C++ (raw pointers, sizes, a
// cudaStream_t, a cudaError_t back), no torch and no device code, so it is included both
// by the .cu kernel files (nvcc) and by the *_binding.cpp files (host compiler).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace specops {

enum class FloatType { kFloat32, kBFloat16, kFloat16 };

// --- token histograms ---
struct BincountParams {
  const void* token_ids;  // [rows, max_len] int32 or int64, row stride ids_stride
  bool ids_int64;
  int64_t ids_stride, rows, max_len;
  int32_t* counts;  // [rows, vocab] contiguous; zeroed by the launcher
  int64_t vocab;
};
cudaError_t launch_token_bincount(const BincountParams& p, cudaStream_t stream);

struct BincountUpdateParams {
  int32_t* counts;  // [rows, vocab], row stride counts_stride
  int64_t counts_stride, rows, vocab;
  const void* req_indices;  // [n] int32 or int64
  bool req_int64;
  const void* token_ids;  // [n] int32 or int64
  bool tok_int64;
  int64_t n;
};
cudaError_t launch_token_bincount_update(const BincountUpdateParams& p, cudaStream_t stream);

// --- penalties ---
struct PenaltyParams {
  void* logits;  // [rows, vocab] FloatType, row stride logits_stride (elements)
  int64_t logits_stride;
  const bool* prompt_mask;  // [rows, vocab]
  int64_t prompt_stride;
  const int32_t* output_counts;  // [rows, vocab] (apply_penalties_), or nullptr
  int64_t counts_stride;
  const bool* output_mask;  // [rows, vocab] (apply_repetition_penalties_), or nullptr
  int64_t output_stride;
  const float* repetition;  // [rows]
  const float* frequency;   // [rows] (apply_penalties_ only)
  const float* presence;    // [rows] (apply_penalties_ only)
  int64_t rows, vocab;
};
// Fused repetition + frequency + presence (output_counts set) or repetition only (output_mask set).
cudaError_t launch_apply_penalties(const PenaltyParams& p, FloatType dtype, int num_sms, cudaStream_t stream);

// --- grammar bitmask ---
struct BitmaskParams {
  void* logits;  // [logits_rows, >= vocab] FloatType, row stride logits_stride
  int64_t logits_stride;
  const int32_t* bitmask;  // [bitmask_rows, >= ceil(vocab / 32)], row stride bitmask_stride
  int64_t bitmask_stride;
  const void* indices;  // [n] int32 or int64, or nullptr (then row i for i < n)
  bool indices_int64;
  int64_t n;           // rows to mask: len(indices) or logits_rows
  int64_t valid_rows;  // min(logits_rows, bitmask_rows): indices outside [0, valid_rows) are skipped
  int64_t vocab;       // columns masked: min(logits width, 32 * bitmask words)
};
cudaError_t launch_apply_token_bitmask(const BitmaskParams& p, FloatType dtype, int num_sms, cudaStream_t stream);

}  // namespace specops
