// CUDA binding of the grammar bitmask op: checks, dtype, stream, launch.
#include <torch/library.h>

#include "common/torch_checks.h"
#include "cuda/binding_utils.h"

namespace specops {
namespace {

void apply_token_bitmask_cuda(at::Tensor& logits, const at::Tensor& bitmask, const std::optional<at::Tensor>& indices) {
  check_bitmask(logits, bitmask, indices);
  check_cuda("apply_token_bitmask_", logits);
  const c10::cuda::CUDAGuard guard(logits.device());
  BitmaskParams p{};
  p.logits = logits.mutable_data_ptr();
  p.logits_stride = row_stride(logits);
  p.bitmask = bitmask.const_data_ptr<int32_t>();
  p.bitmask_stride = row_stride(bitmask);
  p.indices = indices.has_value() ? indices->const_data_ptr() : nullptr;
  p.indices_int64 = indices.has_value() && indices->scalar_type() == at::kLong;
  p.n = indices.has_value() ? indices->size(0) : logits.size(0);
  p.valid_rows = std::min(logits.size(0), bitmask.size(0));
  p.vocab = bitmask_vocab(logits, bitmask);
  check_launch("apply_token_bitmask_", launch_apply_token_bitmask(p, float_type(logits), num_sms(),
                                                                  current_stream()));
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CUDA, m) { m.impl("apply_token_bitmask_", &apply_token_bitmask_cuda); }

}  // namespace specops
