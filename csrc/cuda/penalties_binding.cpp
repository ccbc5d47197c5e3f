// CUDA bindings of the penalty ops: checks, dtype, stream, launch.
#include <torch/library.h>

#include "common/torch_checks.h"
#include "cuda/binding_utils.h"

namespace specops {
namespace {

PenaltyParams base_params(at::Tensor& logits, const at::Tensor& prompt_mask, const at::Tensor& rep) {
  PenaltyParams p{};
  p.logits = logits.mutable_data_ptr();
  p.logits_stride = row_stride(logits);
  p.prompt_mask = prompt_mask.const_data_ptr<bool>();
  p.prompt_stride = row_stride(prompt_mask);
  p.repetition = rep.const_data_ptr<float>();
  p.rows = logits.size(0);
  p.vocab = logits.size(1);
  return p;
}

void apply_penalties_cuda(at::Tensor& logits, const at::Tensor& prompt_mask, const at::Tensor& output_counts,
                          const at::Tensor& repetition_penalties, const at::Tensor& frequency_penalties,
                          const at::Tensor& presence_penalties) {
  check_penalties(logits, prompt_mask, output_counts, repetition_penalties, frequency_penalties,
                  presence_penalties);
  check_cuda("apply_penalties_", logits);
  const c10::cuda::CUDAGuard guard(logits.device());
  PenaltyParams p = base_params(logits, prompt_mask, repetition_penalties);
  p.output_counts = output_counts.const_data_ptr<int32_t>();
  p.counts_stride = row_stride(output_counts);
  p.frequency = frequency_penalties.const_data_ptr<float>();
  p.presence = presence_penalties.const_data_ptr<float>();
  check_launch("apply_penalties_", launch_apply_penalties(p, float_type(logits), num_sms(),
                                                          current_stream()));
}

void apply_repetition_penalties_cuda(at::Tensor& logits, const at::Tensor& prompt_mask,
                                     const at::Tensor& output_mask, const at::Tensor& repetition_penalties) {
  check_repetition(logits, prompt_mask, output_mask, repetition_penalties);
  check_cuda("apply_repetition_penalties_", logits);
  const c10::cuda::CUDAGuard guard(logits.device());
  PenaltyParams p = base_params(logits, prompt_mask, repetition_penalties);
  p.output_mask = output_mask.const_data_ptr<bool>();
  p.output_stride = row_stride(output_mask);
  check_launch("apply_repetition_penalties_", launch_apply_penalties(p, float_type(logits), num_sms(),
                                                                     current_stream()));
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CUDA, m) {
  m.impl("apply_penalties_", &apply_penalties_cuda);
  m.impl("apply_repetition_penalties_", &apply_repetition_penalties_cuda);
}

}  // namespace specops
