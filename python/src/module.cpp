// evoattn._C: the C API for the Python front ends. No torch or jaxlib types, no linkage to
// either: tensors arrive as raw pointers, dtype/device codes, sizes and strides.
#include "bindings.h"

NB_MODULE(_C, m) {
  m.doc() = "evoattn C API bindings (raw pointers, sizes, strides, stream as int)";
  evoattn_py::bind_core(m);
#ifdef EVOATTN_WITH_XLA_FFI
  evoattn_py::bind_xla_ffi(m);
  m.attr("has_xla_ffi") = true;
#else
  m.attr("has_xla_ffi") = false;
#endif
}
