"""evoattn: fused Evoformer attention, forward and backward.

    O = softmax(scale * Q K^T + mask_bias + pair_bias) V       (per batch, row, head)

The C library is ``libevoattn.so`` beside this file; ``evoattn._C`` binds its C API (raw
pointers, sizes, strides) and links neither libtorch nor jaxlib. The front ends are imported on
demand, so that ``import evoattn`` needs neither framework:

    import evoattn.torch   # evoformer_attention, DS4Sci_EvoformerAttention, torch.ops.evoattn.*
    import evoattn.jax     # evoformer_attention through XLA's FFI (jit, grad, vmap)
"""

import os as _os

from . import _C

__version__: str = _C.version_string()


def cuda_available() -> bool:
    """True when this build has the CUDA backend and a CUDA device is visible."""
    return bool(_C.cuda_available())


def has_jax_ffi() -> bool:
    """True when this build contains the XLA FFI handlers that evoattn.jax needs."""
    return bool(_C.has_xla_ffi)


def get_include() -> str:
    """The directory holding evoattn/evoattn.h, for C and C++ users of the bundled library."""
    return _os.path.join(_os.path.dirname(__file__), "include")


def get_library() -> str:
    """The path of the bundled C library (libevoattn.so), for C and C++ users."""
    return _os.path.join(_os.path.dirname(__file__), "libevoattn.so")


__all__ = ["__version__", "cuda_available", "has_jax_ffi", "get_include", "get_library"]
