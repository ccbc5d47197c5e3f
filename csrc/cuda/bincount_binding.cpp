// CUDA bindings of the token histogram ops: checks, stream, launch.
#include <torch/library.h>

#include "common/torch_checks.h"
#include "cuda/binding_utils.h"

namespace specops {
namespace {

at::Tensor token_bincount_cuda(const at::Tensor& token_ids, int64_t vocab_size) {
  check_bincount(token_ids, vocab_size);
  check_cuda("token_bincount", token_ids);
  const c10::cuda::CUDAGuard guard(token_ids.device());
  at::Tensor counts = at::empty({token_ids.size(0), vocab_size}, token_ids.options().dtype(at::kInt));
  BincountParams p{};
  p.token_ids = token_ids.const_data_ptr();
  p.ids_int64 = token_ids.scalar_type() == at::kLong;
  p.ids_stride = row_stride(token_ids);
  p.rows = token_ids.size(0);
  p.max_len = token_ids.size(1);
  p.counts = counts.mutable_data_ptr<int32_t>();
  p.vocab = vocab_size;
  check_launch("token_bincount", launch_token_bincount(p, current_stream()));
  return counts;
}

void token_bincount_update_cuda(at::Tensor& counts, const at::Tensor& req_indices, const at::Tensor& token_ids) {
  check_bincount_update(counts, req_indices, token_ids);
  check_cuda("token_bincount_update_", counts);
  const c10::cuda::CUDAGuard guard(counts.device());
  BincountUpdateParams p{};
  p.counts = counts.mutable_data_ptr<int32_t>();
  p.counts_stride = row_stride(counts);
  p.rows = counts.size(0);
  p.vocab = counts.size(1);
  p.req_indices = req_indices.const_data_ptr();
  p.req_int64 = req_indices.scalar_type() == at::kLong;
  p.token_ids = token_ids.const_data_ptr();
  p.tok_int64 = token_ids.scalar_type() == at::kLong;
  p.n = token_ids.size(0);
  check_launch("token_bincount_update_", launch_token_bincount_update(p, current_stream()));
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CUDA, m) {
  m.impl("token_bincount", &token_bincount_cuda);
  m.impl("token_bincount_update_", &token_bincount_update_cuda);
}

}  // namespace specops
