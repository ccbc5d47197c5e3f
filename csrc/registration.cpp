// The one place where every specops op is declared: TORCH_LIBRARY(specops, m).
// Implementations register themselves per dispatch key in cpu/ and cuda/; the fake
// (meta) implementations and the Python wrappers live in specops/ops/.
// `Tensor(a!)` marks an argument the op writes in place; mutating ops return nothing.
#include <Python.h>
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
