// CPU token histograms: one row per task (at::parallel_for), each row writes only its own
// counts, so no atomics are needed. Ids outside [0, vocab_size) (padding) are skipped.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/torch_checks.h"

namespace specops {
namespace {

template <typename idx_t>
void bincount_rows(const idx_t* ids, int64_t ids_stride, int64_t max_len, int32_t* counts,
                   int64_t vocab, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const idx_t* row = ids + r * ids_stride;
    int32_t* out = counts + r * vocab;
    for (int64_t j = 0; j < max_len; ++j) {
      const int64_t t = static_cast<int64_t>(row[j]);
      if (t >= 0 && t < vocab) ++out[t];
    }
  }
}

at::Tensor token_bincount_cpu(const at::Tensor& token_ids, int64_t vocab_size) {
  check_bincount(token_ids, vocab_size);
  const int64_t rows = token_ids.size(0), max_len = token_ids.size(1);
  at::Tensor counts = at::zeros({rows, vocab_size}, token_ids.options().dtype(at::kInt));
  if (rows == 0 || max_len == 0 || vocab_size == 0) return counts;
  const int64_t stride = row_stride(token_ids);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(max_len, 1));
  AT_DISPATCH_INDEX_TYPES(token_ids.scalar_type(), "token_bincount_cpu", [&] {
    const index_t* ids = token_ids.const_data_ptr<index_t>();
    int32_t* out = counts.mutable_data_ptr<int32_t>();
    at::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
      bincount_rows(ids, stride, max_len, out, vocab_size, b, e);
    });
  });
  return counts;
}

template <typename req_t, typename tok_t>
void update_pairs(int32_t* counts, int64_t counts_stride, int64_t rows, int64_t vocab,
                  const req_t* reqs, const tok_t* toks, int64_t n) {
  // Sequential: a step adds a handful of tokens per request and pairs may repeat.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = static_cast<int64_t>(reqs[i]), t = static_cast<int64_t>(toks[i]);
    if (r >= 0 && r < rows && t >= 0 && t < vocab) ++counts[r * counts_stride + t];
  }
}

void token_bincount_update_cpu(at::Tensor& counts, const at::Tensor& req_indices,
                               const at::Tensor& token_ids) {
  check_bincount_update(counts, req_indices, token_ids);
  const int64_t n = token_ids.size(0);
  if (n == 0 || counts.numel() == 0) return;
  const int64_t rows = counts.size(0), vocab = counts.size(1), stride = row_stride(counts);
  int32_t* out = counts.mutable_data_ptr<int32_t>();
  AT_DISPATCH_INDEX_TYPES(req_indices.scalar_type(), "token_bincount_update_cpu", [&] {
    using req_t = index_t;
    const req_t* reqs = req_indices.const_data_ptr<req_t>();
    AT_DISPATCH_INDEX_TYPES(token_ids.scalar_type(), "token_bincount_update_cpu", [&] {
      update_pairs(out, stride, rows, vocab, reqs, token_ids.const_data_ptr<index_t>(), n);
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("token_bincount", &token_bincount_cpu);
  m.impl("token_bincount_update_", &token_bincount_update_cpu);
}

}  // namespace specops
