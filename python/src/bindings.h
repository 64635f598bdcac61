// Pieces of the evoattn._C extension: the C API bindings and (optionally) the XLA FFI handlers.
#pragma once

#include <nanobind/nanobind.h>

#include "evoattn/evoattn.h"

namespace evoattn_py {

// The C API's functions as Python functions taking tensor views as tuples (see core_bindings.cpp).
void bind_core(nanobind::module_& m);

// `xla_ffi_handlers()`: {target name: PyCapsule} per platform, for jax.ffi.register_ffi_target.
// Defined in xla_ffi_handlers.cpp, built only when jaxlib's FFI headers were found.
void bind_xla_ffi(nanobind::module_& m);

}  // namespace evoattn_py
