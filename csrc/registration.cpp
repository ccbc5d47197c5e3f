// The one place where every specops op is declared: TORCH_LIBRARY(specops, m).
// Implementations register themselves per dispatch key in cpu/ and cuda/; the fake
// (meta) implementations and the Python wrappers live in specops/ops/.
// `Tensor(a!)` marks an argument the op writes in place; mutating ops return nothing.
#include <Python.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

// Importing specops._C loads this library, whose static initialisers register the ops.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

TORCH_LIBRARY(specops, m) {
  // --- token histograms (penalty counts) ---
  // counts[r, t] = number of t in token_ids[r, :]; ids outside [0, vocab_size) are ignored.
  m.def("token_bincount(Tensor token_ids, int vocab_size) -> Tensor");
  // counts[req_indices[i], token_ids[i]] += 1; out-of-range pairs are ignored.
  m.def("token_bincount_update_(Tensor(a!) counts, Tensor req_indices, Tensor token_ids) -> ()");

  // --- penalties ---
  // repetition (prompt or output), then frequency, then presence, in one pass.
  m.def(
      "apply_penalties_(Tensor(a!) logits, Tensor prompt_mask, Tensor output_counts, "
      "Tensor repetition_penalties, Tensor frequency_penalties, Tensor presence_penalties) -> ()");
  // vLLM's standalone op: repetition penalty from boolean prompt/output masks.
  m.def(
      "apply_repetition_penalties_(Tensor(a!) logits, Tensor prompt_mask, Tensor output_mask, "
      "Tensor repetition_penalties) -> ()");

  // --- structured output ---
  // logits[r, j] = -inf where bit j of bitmask row r is 0 (rows r from indices if given).
  m.def("apply_token_bitmask_(Tensor(a!) logits, Tensor bitmask, Tensor? indices=None) -> ()");
}

// No op has a backward. Autograd: a tensor argument that requires grad (with grad mode on)
// is refused, as the Python wrappers refuse it, so that direct torch.ops.specops calls never
// silently drop a gradient. ADInplaceOrView: the version counter of each (a!) argument is
// bumped after the op wrote it, as torch's own in-place ops do, so a tensor autograd saved
// before the op makes backward raise instead of silently using the written values (an
// inference tensor outside inference mode, whose version cannot be bumped, is refused first).
namespace {

constexpr const char* kOpNames[] = {"token_bincount", "token_bincount_update_", "apply_penalties_",
                                    "apply_repetition_penalties_", "apply_token_bitmask_"};

void refuse_grad(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const auto inputs = torch::jit::last(*stack, arguments.size());
  if (c10::GradMode::is_enabled()) {
    for (size_t i = 0; i < arguments.size(); ++i) {
      const std::string& name = arguments[i].name();
      TORCH_CHECK_VALUE(!(inputs[i].isTensor() && inputs[i].toTensor().requires_grad()), op.schema().name(),
                        ": ", name, " requires grad, but the op has no backward; call it under torch.no_grad() "
                        "or on ", name, ".detach()");
    }
  }
  at::AutoDispatchBelowAutograd guard;
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

void bump_written_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  std::vector<at::Tensor> written;
  const auto inputs = torch::jit::last(*stack, arguments.size());
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = arguments[i].alias_info();
    if (alias == nullptr || !alias->isWrite() || !inputs[i].isTensor()) continue;
    const at::Tensor& t = inputs[i].toTensor();
    TORCH_CHECK_VALUE(!t.is_inference() || c10::InferenceMode::is_enabled(), op.schema().name(), ": ",
                      arguments[i].name(), " is an inference tensor (made under torch.inference_mode()), which "
                      "cannot be written in place outside inference mode; call it under torch.inference_mode() "
                      "or on a clone");
    written.push_back(t);
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) t.unsafeGetTensorImpl()->bump_version();
}

}  // namespace

TORCH_LIBRARY_IMPL(specops, Autograd, m) {
  for (const char* name : kOpNames) m.impl(name, torch::CppFunction::makeFromBoxedFunction<&refuse_grad>());
}

TORCH_LIBRARY_IMPL(specops, ADInplaceOrView, m) {
  for (const char* name : kOpNames) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&bump_written_versions>());
  }
}
