"""What the front ends share: the C library's errors as Python exceptions that name the user's
call ("evoattn.torch.evoformer_attention: argument 'k': ..."), one exception type per kind."""

from . import _C

# Kinds of error (the C API's status strings, plus "dtype" for a dtype the library does not
# take and "bad view" for a malformed view tuple) that are the caller's values.
_VALUE_KINDS = ("invalid argument", "unsupported", "workspace too small")


def error(call: str, kind: str, message: str) -> Exception:
    """TypeError for dtypes, ValueError for other bad arguments, RuntimeError for the rest (no
    backend for the device, a CUDA error); the C function's name in `message` becomes `call`."""
    if message.startswith("evoattn_"):
        message = message.split(": ", 1)[-1]
    message = f"{call}: {message}"
    if kind in ("dtype", "bad view") or "expected dtype" in message:
        return TypeError(message)
    if kind in _VALUE_KINDS:
        return ValueError(message)
    return RuntimeError(message)


def call(api_call: str, fn, *args):
    """fn(*args) -> (status, message[, value]) from evoattn._C; returns value (or None) and
    raises error(api_call, ...) on failure."""
    status, message, *value = fn(*args)
    if status == _C.SUCCESS:
        return value[0] if value else None
    kind = "bad view" if status == _C.BAD_VIEW else _C.status_string(status)
    raise error(api_call, kind, message)
