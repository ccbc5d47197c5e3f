// Argument checks shared by the CPU implementations and the CUDA bindings. The Python
// wrappers in specops/ops/ check the same things first with friendlier errors; these
// keep direct torch.ops.specops.* calls from reading or writing out of bounds.
#pragma once
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <initializer_list>
#include <string>

namespace specops {

// Numbers, shapes and devices enter error messages as strings made here (std::to_string),
// never streamed into the message: with the GPU machine's torch 2.11 build, streaming an
// integer (std::ostream's locale-dependent number formatting) segfaulted the process
// (bench/results/logs/direct_op_errors_2026-12-07_s70_h100.txt), while strings were fine.
inline std::string num(int64_t v) { return std::to_string(v); }

// "[2, 8]"
inline std::string shape_str(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

inline void check_dtype(const char* op, const char* name, const at::Tensor& t,
                        std::initializer_list<at::ScalarType> dtypes) {
  for (auto d : dtypes)
    if (t.scalar_type() == d) return;
  std::string expected;
  for (auto d : dtypes) expected += (expected.empty() ? "" : " or ") + std::string(c10::toString(d));
  TORCH_CHECK_TYPE(false, op, ": ", name, " must be ", expected, ", got ", c10::toString(t.scalar_type()));
}

inline void check_dim(const char* op, const char* name, const at::Tensor& t, int64_t dim) {
  TORCH_CHECK_VALUE(t.dim() == dim, op, ": ", name, " must be ", num(dim), "-D, got shape ", shape_str(t.sizes()));
}

// The last dimension must be contiguous; rows may be strided (a slice of a wider buffer). An
// empty tensor reads nothing, whatever its strides (torch's .contiguous() keeps them: (1, 0)).
inline void check_rows(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.size(-1) <= 1 || t.numel() == 0 || t.stride(-1) == 1, op, ": ", name,
                    " must have a contiguous last dimension (stride 1), got strides ", shape_str(t.strides()));
}

inline void check_same_device(const char* op, const char* name, const at::Tensor& t,
                              const at::Tensor& ref) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", name, " must be on ", ref.device().str(),
                    " (the device of the first argument), got ", t.device().str());
}

inline void check_shape(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef shape) {
  bool same = t.dim() == static_cast<int64_t>(shape.size());
  for (int64_t i = 0; same && i < t.dim(); ++i) same = t.size(i) == shape[i];
  TORCH_CHECK_VALUE(same, op, ": ", name, " must have shape ", shape_str(shape), ", got ", shape_str(t.sizes()));
}

// A tensor the op writes in place: no two elements may share memory (a stride of 0 on a
// dimension of size > 1, as expand makes, or 2-D rows closer than their length), or the rows
// would add their writes up (and race). Rows further apart than their length are fine.
inline void check_no_internal_overlap(const char* op, const char* name, const at::Tensor& t) {
  const bool rows_overlap = t.dim() == 2 && t.size(0) > 1 && t.size(1) > 1 && t.stride(0) < t.size(1);
  TORCH_CHECK_VALUE(!rows_overlap && at::has_internal_overlap(t) != at::MemOverlap::Yes, op, ": ", name,
                    " is written in place, so its elements must not share memory; got strides ",
                    shape_str(t.strides()), " for shape ", shape_str(t.sizes()),
                    " (from expand or as_strided?): pass .clone()");
}

// Row stride in elements; 0-row and 1-row tensors report their row length so kernels can
// treat every tensor alike.
inline int64_t row_stride(const at::Tensor& t) { return t.size(0) <= 1 ? t.size(1) : t.stride(0); }

// The widest vocabulary any op takes (logits / counts columns, token_bincount's vocab_size):
// the CUDA kernels keep in-row offsets in int. CPU refuses the same, so both agree.
constexpr int64_t kMaxVocab = (int64_t{1} << 31) - (int64_t{1} << 20) - 1;

inline void check_vocab_width(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.size(1) <= kMaxVocab, op, ": ", name, " must have at most ", num(kMaxVocab),
                    " columns, got ", num(t.size(1)));
}

// ---- per-op checks, identical on CPU and CUDA ----

inline void check_bincount(const at::Tensor& token_ids, int64_t vocab_size) {
  const char* op = "token_bincount";
  check_dtype(op, "token_ids", token_ids, {at::kInt, at::kLong});
  check_dim(op, "token_ids", token_ids, 2);
  check_rows(op, "token_ids", token_ids);
  TORCH_CHECK_VALUE(vocab_size >= 0 && vocab_size <= kMaxVocab, op, ": vocab_size must be in [0, ", num(kMaxVocab),
                    "], got ", num(vocab_size));
}

inline void check_bincount_update(const at::Tensor& counts, const at::Tensor& req_indices,
                                  const at::Tensor& token_ids) {
  const char* op = "token_bincount_update_";
  check_dtype(op, "counts", counts, {at::kInt});
  check_dim(op, "counts", counts, 2);
  check_rows(op, "counts", counts);
  check_vocab_width(op, "counts", counts);
  check_no_internal_overlap(op, "counts", counts);
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"req_indices", &req_indices},
                         {"token_ids", &token_ids}}) {
    check_dtype(op, name, *t, {at::kInt, at::kLong});
    check_dim(op, name, *t, 1);
    check_rows(op, name, *t);
    check_same_device(op, name, *t, counts);
  }
  TORCH_CHECK_VALUE(req_indices.size(0) == token_ids.size(0), op,
                    ": req_indices and token_ids must have the same length, got ", num(req_indices.size(0)),
                    " and ", num(token_ids.size(0)));
}

inline void check_logits(const char* op, const at::Tensor& logits) {
  check_dtype(op, "logits", logits, {at::kFloat, at::kBFloat16, at::kHalf});
  check_dim(op, "logits", logits, 2);
  check_rows(op, "logits", logits);
  check_vocab_width(op, "logits", logits);
  check_no_internal_overlap(op, "logits", logits);
}

inline void check_row_params(const char* op, const char* name, const at::Tensor& t,
                             const at::Tensor& logits) {
  check_dtype(op, name, t, {at::kFloat});
  check_shape(op, name, t, {logits.size(0)});
  check_rows(op, name, t);
  check_same_device(op, name, t, logits);
}

inline void check_vocab_matrix(const char* op, const char* name, const at::Tensor& t,
                               at::ScalarType dtype, const at::Tensor& logits) {
  check_dtype(op, name, t, {dtype});
  check_shape(op, name, t, logits.sizes());
  check_rows(op, name, t);
  check_same_device(op, name, t, logits);
}

inline void check_penalties(const at::Tensor& logits, const at::Tensor& prompt_mask,
                            const at::Tensor& output_counts, const at::Tensor& rep,
                            const at::Tensor& freq, const at::Tensor& pres) {
  const char* op = "apply_penalties_";
  check_logits(op, logits);
  check_vocab_matrix(op, "prompt_mask", prompt_mask, at::kBool, logits);
  check_vocab_matrix(op, "output_counts", output_counts, at::kInt, logits);
  check_row_params(op, "repetition_penalties", rep, logits);
  check_row_params(op, "frequency_penalties", freq, logits);
  check_row_params(op, "presence_penalties", pres, logits);
}

inline void check_repetition(const at::Tensor& logits, const at::Tensor& prompt_mask,
                             const at::Tensor& output_mask, const at::Tensor& rep) {
  const char* op = "apply_repetition_penalties_";
  check_logits(op, logits);
  check_vocab_matrix(op, "prompt_mask", prompt_mask, at::kBool, logits);
  check_vocab_matrix(op, "output_mask", output_mask, at::kBool, logits);
  check_row_params(op, "repetition_penalties", rep, logits);
}

inline void check_bitmask(const at::Tensor& logits, const at::Tensor& bitmask,
                          const std::optional<at::Tensor>& indices) {
  const char* op = "apply_token_bitmask_";
  check_logits(op, logits);
  check_dtype(op, "bitmask", bitmask, {at::kInt});
  check_dim(op, "bitmask", bitmask, 2);
  check_rows(op, "bitmask", bitmask);
  check_same_device(op, "bitmask", bitmask, logits);
  if (indices.has_value()) {
    check_dtype(op, "indices", *indices, {at::kInt, at::kLong});
    check_dim(op, "indices", *indices, 1);
    check_rows(op, "indices", *indices);
    check_same_device(op, "indices", *indices, logits);
  } else {
    TORCH_CHECK_VALUE(bitmask.size(0) == logits.size(0), op,
                      ": without indices, bitmask must have one row per logits row (",
                      num(logits.size(0)), "), got ", num(bitmask.size(0)));
  }
}

// Columns the bitmask applies to: min(logits width, 32 * bitmask words), as in xgrammar.
inline int64_t bitmask_vocab(const at::Tensor& logits, const at::Tensor& bitmask) {
  return std::min<int64_t>(logits.size(1), bitmask.size(1) * 32);
}

}  // namespace specops
