"""Calls into the extension: each returns (status, message[, value]); this raises.

The extension never throws a C++ exception for a bad input (see core_bindings.cpp), so every
error reaches Python as a status and becomes the exception here.
"""

from . import _C

_VALUE_ERRORS = (_C.ERROR_INVALID_ARGUMENT, _C.ERROR_UNSUPPORTED, _C.ERROR_WORKSPACE_TOO_SMALL)


def call(fn, *args):
    """fn(*args) -> (status, message[, value]); returns value (or None), raises on failure:
    TypeError for a malformed view, ValueError for invalid/unsupported input or a too-small
    workspace, RuntimeError for the rest (no backend, CUDA error)."""
    status, message, *value = fn(*args)
    if status == _C.SUCCESS:
        return value[0] if value else None
    if status == _C.BAD_VIEW:
        raise TypeError(message)
    if status in _VALUE_ERRORS:
        raise ValueError(message)
    raise RuntimeError(message)
