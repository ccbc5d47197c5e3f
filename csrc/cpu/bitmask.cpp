// CPU grammar bitmask apply: rows in parallel; a word of all ones (every token allowed)
// is skipped, only disallowed tokens are written.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <limits>

#include "common/torch_checks.h"

namespace specops {
namespace {

template <typename scalar_t>
void mask_row(scalar_t* lrow, const int32_t* brow, int64_t vocab) {
  const scalar_t neg_inf = static_cast<scalar_t>(-std::numeric_limits<float>::infinity());
  const int64_t words = (vocab + 31) / 32;
  for (int64_t w = 0; w < words; ++w) {
    const uint32_t bits = static_cast<uint32_t>(brow[w]);
    if (bits == 0xFFFFFFFFu) continue;
    const int64_t base = w * 32, n = std::min<int64_t>(32, vocab - base);
    for (int64_t j = 0; j < n; ++j)
      if (!((bits >> j) & 1u)) lrow[base + j] = neg_inf;
  }
}

template <typename idx_t>
int64_t index_at(const void* indices, int64_t i) {
  return static_cast<int64_t>(static_cast<const idx_t*>(indices)[i]);
}

void apply_token_bitmask_cpu(at::Tensor& logits, const at::Tensor& bitmask,
                             const std::optional<at::Tensor>& indices) {
  check_bitmask(logits, bitmask, indices);
  const int64_t vocab = bitmask_vocab(logits, bitmask);
  const int64_t n = indices.has_value() ? indices->size(0) : logits.size(0);
  // With indices, indices[i] names a row of logits and of bitmask (xgrammar's rule);
  // rows outside both are ignored.
  const int64_t valid_rows = std::min(logits.size(0), bitmask.size(0));
  if (n == 0 || vocab == 0) return;
  const int64_t ls = row_stride(logits), bs = row_stride(bitmask);
  const int32_t* bits = bitmask.const_data_ptr<int32_t>();
  const void* idx = indices.has_value() ? indices->const_data_ptr() : nullptr;
  const bool idx64 = indices.has_value() && indices->scalar_type() == at::kLong;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "apply_token_bitmask_cpu", [&] {
    scalar_t* out = logits.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, std::max<int64_t>(1, 32768 / vocab), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t r = idx == nullptr ? i : (idx64 ? index_at<int64_t>(idx, i) : index_at<int32_t>(idx, i));
        if (r < 0 || r >= valid_rows) continue;
        mask_row(out + r * ls, bits + r * bs, vocab);
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CPU, m) { m.impl("apply_token_bitmask_", &apply_token_bitmask_cpu); }

}  // namespace specops
