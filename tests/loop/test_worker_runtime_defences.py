"""The worker's run-time defences, tested below the static guards (`loop.worker.supervise`
directly, as if a candidate had found a way past the ban list): torch modes left active, lazy
output containers, answers from memory in timed calls, and a crash staged during another
runner's block to get that runner blamed."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest

from loop.worker import supervise

SHAPES = ["decode-7x256"]
RULE = {"samples_per_block": 3, "min_blocks": 2, "max_blocks": 4, "max_time_s": 0.5, "warmup": 1}
HONEST = """
import torch
LANGUAGE = "torch"
def kernel(x, weight):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)
"""
MODE = """
import torch
from torch.overrides import TorchFunctionMode
LANGUAGE = "torch"
class _Lie(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "vector_norm":  # the harness's error is zero
            return out * 0
        return out
"""
MODE_AT_IMPORT = (
    MODE
    + """
_Lie().__enter__()
def kernel(x, weight):
    return (x.float() * weight.float()).to(x.dtype)
"""
)
DISPATCH_MODE_PER_CALL = """
import torch
from torch.utils._python_dispatch import TorchDispatchMode
LANGUAGE = "torch"
class _Slow(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))
def kernel(x, weight):
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)
    _Slow().__enter__()  # every torch call after this one, the harness's and the peers', pays
    return y
"""
AUTOCAST_LEFT_ON = """
import torch
LANGUAGE = "torch"
def _held():
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the harness's reference in bfloat16
        yield
_gen = _held()
next(_gen)
def kernel(x, weight):
    return (x.float() * weight.float()).to(x.dtype)
"""
REBINDS_THE_CHECK = """
import sys
import torch
LANGUAGE = "torch"
sys.modules["loop.worker"]._check_outputs = lambda *args: (None, 0.0)  # every output passes
def kernel(x, weight):
    return (x.float() * weight.float()).to(x.dtype)
"""
LAZY = """
import torch
LANGUAGE = "torch"
class _Later(list):
    def __iter__(self):
        x, weight = list.__getitem__(self, 0)
        xf = x.float()
        yield (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(
            x.dtype
        )
def kernel(x, weight):
    return _Later([(x, weight)])
"""
FROM_MEMORY_WHEN_TIMED = """
import torch
LANGUAGE = "torch"
_calls = [0]
_last = [None]
def kernel(x, weight):
    _calls[0] += 1
    if _calls[0] > 6 and _last[0] is not None:  # verification is over: answer from memory
        return _last[0]
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)
    _last[0] = y
    return y
"""
# Crashes its process the moment another runner's Python code is entered (a peer's function or
# a rival candidate's kernel), once verification is over: the last progress mark then names
# that runner. (A profile hook is banned by the static guards; so are the finalizers and
# threads that could do the same by polling, which is why this test calls the worker directly.)
FRAMER = """
import sys
import numpy
import torch
LANGUAGE = "torch"
_calls = [0]
def _boom():
    base = numpy.zeros(1)
    return float(numpy.lib.stride_tricks.as_strided(base, shape=(1 << 20,), strides=(1 << 40,)).sum())
def _in_someone_else(frame, event, arg):
    code = frame.f_code
    if event == "call" and code.co_name in ("kernel", "eager") and code.co_filename != __file__:
        _boom()
def kernel(x, weight):
    _calls[0] += 1
    if _calls[0] > 8:  # past verification
        sys.setprofile(_in_someone_else)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)
"""


# The same, but what surfaces in the other runner's code is a GPU fault, as an asynchronous
# error from one's own kernel surfaces at the next runner's synchronisation.
FAULTER = FRAMER.replace(
    "        _boom()",
    '        raise RuntimeError("CUDA error: an illegal memory access was encountered")',
)


def run(tmp_path: Path, sources: dict[str, str], peers=(), time_it=False) -> dict[str, dict]:
    candidates = []
    for label, source in sources.items():
        path = tmp_path / f"{label}.py"
        path.write_text(source)
        candidates.append({"label": label, "path": str(path), "params": {}})
    request = {
        "task": "rmsnorm",
        "device": "cpu",
        "secret": secrets.randbits(62),
        "candidates": candidates,
        "peers": list(peers),
        "shapes": SHAPES,
        "time": time_it,
        "rule": RULE,
        "timeout_s": 120,
    }
    result = supervise(request, time.monotonic())
    return {r["label"]: r for r in result["runners"]}


def codes(runner: dict) -> list[tuple[str, str]]:
    return [(r["code"], r["message"]) for r in runner["reasons"]]


def test_a_torch_mode_left_active_is_caught_and_removed(tmp_path) -> None:
    got = run(
        tmp_path,
        {"at_import": MODE_AT_IMPORT, "per_call": DISPATCH_MODE_PER_CALL, "honest": HONEST},
    )
    assert codes(got["at_import"]) == [
        ("forbidden-call", "importing it left a torch function mode active")
    ]
    assert codes(got["per_call"]) == [
        ("forbidden-call", "decode-7x256: the call left a torch dispatch mode active")
    ]
    assert got["honest"]["verdict"] == "accepted"


def test_thread_local_state_left_changed_is_caught(tmp_path) -> None:
    got = run(tmp_path, {"autocast": AUTOCAST_LEFT_ON, "honest": HONEST})
    assert codes(got["autocast"]) == [
        ("forbidden-call", "importing it changed CPU autocast (False to True)")
    ]
    assert got["honest"]["verdict"] == "accepted"


def test_rebinding_the_harness_is_caught_and_undone(tmp_path) -> None:
    got = run(tmp_path, {"rebinds": REBINDS_THE_CHECK, "honest": HONEST})
    assert codes(got["rebinds"]) == [
        ("forbidden-call", "importing it rebound loop.worker._check_outputs")
    ]
    assert got["honest"]["verdict"] == "accepted"


def test_a_mode_entered_only_when_timed_is_caught_there(tmp_path) -> None:
    timed_only = DISPATCH_MODE_PER_CALL.replace(
        "    _Slow().__enter__()",
        "    if _n.append(1) or len(_n) > 6:\n        _Slow().__enter__()",
    ).replace("def kernel", "_n = []\ndef kernel")
    got = run(tmp_path, {"timed_only": timed_only, "honest": HONEST}, ["eager"], time_it=True)
    assert [c for c, _ in codes(got["timed_only"])] == ["forbidden-call"]
    assert "left a torch dispatch mode" in codes(got["timed_only"])[0][1]
    assert got["honest"]["verdict"] == "accepted" and got["eager"]["shapes"][SHAPES[0]]["blocks_s"]


def test_a_lazy_output_container_is_not_a_tensor(tmp_path) -> None:
    got = run(tmp_path, {"lazy": LAZY})
    assert [c for c, _ in codes(got["lazy"])] == ["wrong-output-type"]


def test_answers_from_memory_in_timed_calls_are_caught_while_timed(tmp_path) -> None:
    got = run(tmp_path, {"memory": FROM_MEMORY_WHEN_TIMED, "honest": HONEST}, time_it=True)
    (code, message), *_ = codes(got["memory"])
    assert code == "reverify-mismatch" and message.startswith("during timing:")
    assert got["honest"]["verdict"] == "accepted"


@pytest.mark.parametrize("peers", [["eager"], []], ids=["with-peers", "candidates-only"])
@pytest.mark.parametrize("framer", [FRAMER, FAULTER], ids=["crash", "device-fault"])
def test_a_failure_staged_in_another_runners_block_convicts_only_its_author(
    tmp_path, peers, framer
) -> None:
    got = run(tmp_path, {"framer": framer, "honest": HONEST}, peers, time_it=True)
    assert got["honest"]["verdict"] == "accepted", codes(got["honest"])
    assert got["honest"]["shapes"][SHAPES[0]]["blocks_s"]
    if peers:
        # alone with the peers, the framer kills its own child: convicted
        assert [c for c, _ in codes(got["framer"])] == ["crash"]
        assert "dropped" not in got["eager"]["shapes"][SHAPES[0]]
    else:
        # alone it never crashes: timed apart, honestly, and nobody is convicted
        assert got["framer"]["verdict"] == "accepted"
