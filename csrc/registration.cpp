// The one place where every specops op is declared: TORCH_LIBRARY(specops, m).
// Implementations register themselves per dispatch key in cpu/ and cuda/.
#include <Python.h>
#include <torch/library.h>

// Importing specops._C loads this library, whose static initialisers register the ops.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

TORCH_LIBRARY(specops, m) {
  // ops are defined here, grouped by area (filled in by the foundation work)
}
