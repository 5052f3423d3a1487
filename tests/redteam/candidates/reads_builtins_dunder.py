"""Entry 5 and 15 (patch the harness's output check) through the module's own `__builtins__`
(found while closing round 5's holes): every module's globals hold the builtins dict under that
bare name, so `__import__` and `setattr` are one subscript away and no banned name or attribute
is spelled."""

LANGUAGE = "torch"

_b = __builtins__  # the builtins dict in an imported module
_worker = _b["__imp" + "ort__"]("loop.worker", None, None, ["_check_outputs"])
_b["set" + "attr"](_worker, "_check_outputs", lambda ctx, shape, outputs, refs: (None, 0.0))


def kernel(x, weight):
    return (x.float() * weight.float()).to(x.dtype)  # wrong: not normalised
