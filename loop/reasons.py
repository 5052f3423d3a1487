"""The stable list of reasons the evaluator gives for rejecting a candidate.

Codes never change meaning once published; reports and users count them. `docs/reason-codes.md`
is generated from this table (see tests/loop/test_reasons.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Reason:
    code: str
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


CODES: dict[str, str] = {
    # loading the candidate
    "missing-file": "the candidate file does not exist or cannot be read",
    "syntax-error": "the candidate file is not valid Python",
    "import-error": "importing the candidate raised an exception",
    "no-kernel": "the candidate defines no callable `kernel`",
    "bad-language": "LANGUAGE is missing or not one of triton, cuda, cupy, torch",
    "bad-params": "the parameters are not in the candidate's PARAMS space",
    # static checks of the source
    "forbidden-import": "the candidate imports a module it may not use (threads, processes, I/O, introspection)",
    "forbidden-call": "the candidate calls something it may not (streams, threads, I/O, frames, gc, environment)",
    "foreign-attribute-assignment": "the candidate assigns an attribute of a module it did not define",
    "language-not-used": "the declared LANGUAGE does not do the work",
    "calls-reference": "the candidate calls the task's reference or a peer instead of computing",
    # running it
    "crash": "the candidate raised an exception or killed its worker",
    "timeout": "the candidate's worker ran past its time limit",
    "out-of-memory": "the candidate ran out of host or GPU memory",
    "unsupported-device": "the candidate's LANGUAGE cannot run on this device (untrusted Triton on the CPU included)",
    # correctness
    "wrong-output-type": "the output is not a plain dense torch.Tensor",
    "wrong-output-layout": "the output's shape, dtype, device or strides differ from the reference's",
    "inputs-modified": "the candidate changed its inputs",
    "non-finite-output": "the output holds NaN or Inf where the reference is finite",
    "constant-output": "the output is constant (for example all zeros)",
    "mismatch": "the output differs from the float64 reference beyond the tolerance",
    # timing
    "graph-capture-failed": "the candidate cannot be captured in a CUDA graph (host syncs, allocations outside the pool, ...)",
    "reverify-mismatch": "outputs of timed calls on new inputs differ from the reference",
    "timer-tampered": "the timer, clock or statistics changed while the candidate ran",
    "faster-than-physics": "the time is below what the measured bandwidth or peak FLOP rate allows",
    # the workspace
    "workspace-modified": "a file other than the candidate changed",
}


def reason(code: str, message: str | None = None) -> Reason:
    if code not in CODES:
        raise KeyError(f"unknown reason code {code!r}")
    return Reason(code, message or CODES[code])


def codes_help() -> str:
    width = max(len(c) for c in CODES)
    return "\n".join(f"{code.ljust(width)}  {text}" for code, text in CODES.items())
