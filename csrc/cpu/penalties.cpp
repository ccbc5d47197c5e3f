// CPU penalties: rows in parallel (at::parallel_for), one pass over each row's logits.
// The arithmetic is common/penalty_math.h, shared with the CUDA kernels.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/penalty_math.h"
#include "common/torch_checks.h"

namespace specops {
namespace {

int64_t row_grain(int64_t vocab) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(vocab, 1)); }

void apply_penalties_cpu(at::Tensor& logits, const at::Tensor& prompt_mask,
                         const at::Tensor& output_counts, const at::Tensor& repetition_penalties,
                         const at::Tensor& frequency_penalties, const at::Tensor& presence_penalties) {
  check_penalties(logits, prompt_mask, output_counts, repetition_penalties, frequency_penalties,
                  presence_penalties);
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0 || vocab == 0) return;
  const int64_t ls = row_stride(logits), ms = row_stride(prompt_mask), cs = row_stride(output_counts);
  const bool* mask = prompt_mask.const_data_ptr<bool>();
  const int32_t* counts = output_counts.const_data_ptr<int32_t>();
  const float* rep = repetition_penalties.const_data_ptr<float>();
  const float* freq = frequency_penalties.const_data_ptr<float>();
  const float* pres = presence_penalties.const_data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "apply_penalties_cpu", [&] {
    scalar_t* out = logits.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, row_grain(vocab), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const float rp = rep[r], fp = freq[r], pp = pres[r];
        if (penalties_neutral(rp, fp, pp)) continue;
        scalar_t* lrow = out + r * ls;
        const bool* mrow = mask + r * ms;
        const int32_t* crow = counts + r * cs;
        if (rp == 1.0f) {  // no repetition penalty: the prompt mask is not read (as on CUDA)
          for (int64_t j = 0; j < vocab; ++j)
            lrow[j] = static_cast<scalar_t>(penalize(static_cast<float>(lrow[j]), false, crow[j], rp, fp, pp));
        } else {
          for (int64_t j = 0; j < vocab; ++j)
            lrow[j] = static_cast<scalar_t>(penalize(static_cast<float>(lrow[j]), mrow[j], crow[j], rp, fp, pp));
        }
      }
    });
  });
}

void apply_repetition_penalties_cpu(at::Tensor& logits, const at::Tensor& prompt_mask,
                                    const at::Tensor& output_mask, const at::Tensor& repetition_penalties) {
  check_repetition(logits, prompt_mask, output_mask, repetition_penalties);
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0 || vocab == 0) return;
  const int64_t ls = row_stride(logits), ps = row_stride(prompt_mask), os = row_stride(output_mask);
  const bool* pmask = prompt_mask.const_data_ptr<bool>();
  const bool* omask = output_mask.const_data_ptr<bool>();
  const float* rep = repetition_penalties.const_data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "apply_repetition_penalties_cpu", [&] {
    scalar_t* out = logits.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, row_grain(vocab), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const float rp = rep[r];
        if (rp == 1.0f) continue;
        scalar_t* lrow = out + r * ls;
        const bool* prow = pmask + r * ps;
        const bool* orow = omask + r * os;
        for (int64_t j = 0; j < vocab; ++j)
          lrow[j] = static_cast<scalar_t>(repetition_penalize(static_cast<float>(lrow[j]), prow[j] || orow[j], rp));
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, CPU, m) {
  m.impl("apply_penalties_", &apply_penalties_cpu);
  m.impl("apply_repetition_penalties_", &apply_repetition_penalties_cpu);
}

}  // namespace specops
