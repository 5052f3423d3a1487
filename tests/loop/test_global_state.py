"""The global torch state a candidate must leave alone: what `changed` reports, and that it sets
back what it can."""

from __future__ import annotations

import torch

from loop import global_state


def test_nothing_changed_is_nothing_to_report() -> None:
    before = global_state.snapshot(torch)
    assert global_state.changed(torch, before) is None


def test_flags_are_reported_and_set_back() -> None:
    before = global_state.snapshot(torch)
    threads = torch.get_num_threads()
    torch.set_grad_enabled(False)
    assert global_state.changed(torch, before) == "changed grad mode (True to False)"
    assert torch.is_grad_enabled()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(threads + 1)
    assert global_state.changed(torch, before).startswith("changed the default dtype")
    assert torch.get_default_dtype() == torch.float32 and torch.get_num_threads() == threads
    assert global_state.changed(torch, before) is None


def test_a_context_left_open_by_a_generator_is_seen() -> None:
    def held():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield

    before = global_state.snapshot(torch)
    gen = held()
    next(gen)  # never closed: autocast stays on for everything after
    assert global_state.changed(torch, before) == "changed CPU autocast (False to True)"
    assert not torch.is_autocast_enabled("cpu")
    gen.close()
    assert global_state.changed(torch, before) is None


def test_a_mode_left_on_the_stack_is_popped() -> None:
    from torch.overrides import TorchFunctionMode

    before = global_state.snapshot(torch)
    TorchFunctionMode().__enter__()
    assert global_state.changed(torch, before) == "left a torch function mode active"
    assert torch._C._len_torch_function_stack() == before["a torch function mode"]


def test_a_profiler_left_recording_is_seen() -> None:
    def held():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            yield

    before = global_state.snapshot(torch)
    gen = held()
    next(gen)
    assert global_state.changed(torch, before) == "changed the autograd profiler (False to True)"
    gen.close()
    assert global_state.changed(torch, before) is None


def test_rebinding_the_harness_or_torch_is_reported_and_undone() -> None:
    import baselines.timer as timer
    from loop import worker

    before = global_state.snapshot(torch)
    check, block = worker._check_outputs, timer.cpu_block
    worker._check_outputs = lambda *args: (None, 0.0)  # what an exec past the guards could do
    timer.cpu_block = lambda fn, n: [1e-9] * n
    assert global_state.changed(torch, before) == "rebound loop.worker._check_outputs"
    assert worker._check_outputs is check and timer.cpu_block is block
    torch.Tensor.equal = lambda a, b: True  # shadows the C method
    assert global_state.changed(torch, before) == "rebound torch.Tensor.equal"
    assert not torch.ones(2).equal(torch.zeros(2))


def test_the_childs_plumbing_is_watched_too() -> None:
    import json
    import random

    before = global_state.snapshot(torch)
    encode, draw = json.JSONEncoder.encode, random.SystemRandom.random
    json.JSONEncoder.encode = lambda self, o: "{}"  # forges every result line
    random.SystemRandom.random = lambda self: 0.99  # no timed output would be checked
    assert global_state.changed(torch, before) == "rebound json.JSONEncoder.encode"
    assert json.JSONEncoder.encode is encode and random.SystemRandom.random is draw
    assert json.dumps({"a": 1}) == '{"a": 1}'


def test_warning_filters_are_set_back() -> None:
    import warnings

    before = global_state.snapshot(torch)
    warnings.simplefilter("error")  # a rival's warning would become an exception in its code
    assert global_state.changed(torch, before).startswith("changed the warning filters")
    assert global_state.changed(torch, before) is None
    assert not any(f[0] == "error" for f in warnings.filters)


def test_filters_a_library_adds_when_it_loads_are_no_change() -> None:
    import warnings

    before = global_state.snapshot(torch)
    count = len(warnings.filters)
    try:
        # what a lazily imported module does at import (seen on the H200 under a CuPy kernel)
        warnings.filterwarnings("ignore", message="a library's own notice")
        warnings.simplefilter("default", DeprecationWarning)
        assert global_state.changed(torch, before) is None
    finally:
        del warnings.filters[: len(warnings.filters) - count]


def test_the_tasks_torch_functions_are_watched() -> None:
    from loop.tasks import load_task

    source = (load_task("rmsnorm").folder / "task.py").read_text()
    names = global_state.task_torch_names(source)
    assert "torch.rsqrt" in names
    before = global_state.snapshot(torch, names)
    rsqrt = torch.rsqrt
    torch.rsqrt = torch.ones_like  # the reference would agree with a kernel that skips it
    assert global_state.changed(torch, before) == "rebound torch.rsqrt"
    assert torch.rsqrt is rsqrt


def test_filters_that_raise_are_reported_however_they_are_spelled() -> None:
    import warnings

    class Action(str):
        def __eq__(self, other: object) -> bool:  # unequal to "error" here, "error" in C
            return other == "ignore"

        __hash__ = str.__hash__

    before = global_state.snapshot(torch)
    warnings.simplefilter(Action("error"))
    assert global_state.changed(torch, before).startswith("changed the warning filters")
    assert global_state.changed(torch, before) is None
    warnings.defaultaction = "error"
    assert global_state.changed(torch, before) is not None
    assert warnings.defaultaction != "error"


def test_filters_that_only_show_more_are_set_back_silently() -> None:
    import warnings

    before = global_state.snapshot(torch)
    filters = list(warnings.filters)
    warnings.simplefilter("always")  # a rival that warns on every call would print every time
    assert global_state.changed(torch, before) is None
    assert warnings.filters == filters


def test_a_name_added_to_the_harness_is_reported_and_removed() -> None:
    import loop.worker as harness

    before = global_state.snapshot(torch)
    harness.float = lambda x: 0.0  # enum.global_enum can do this without an assignment
    assert global_state.changed(torch, before) == "rebound loop.worker.float"
    assert "float" not in vars(harness)


def test_the_json_encoder_module_and_random_are_watched() -> None:
    import json.encoder
    import random

    before = global_state.snapshot(torch)
    make, recip = json.encoder.c_make_encoder, random.RECIP_BPF
    json.encoder.c_make_encoder = None  # a forged encoder would rewrite every result line
    random.RECIP_BPF = 1.0  # no timed output would be drawn for checking
    assert global_state.changed(torch, before) == "rebound json.encoder.c_make_encoder"
    assert json.encoder.c_make_encoder is make and recip == random.RECIP_BPF


def test_pythons_own_warning_registry_in_the_harness_is_no_change() -> None:
    import loop.worker as harness

    before = global_state.snapshot(torch)
    harness.__warningregistry__ = {"version": 0}  # warnings.warn(stacklevel=2) from a kernel
    try:
        assert global_state.changed(torch, before) is None
    finally:
        del harness.__warningregistry__


def test_a_name_added_to_builtins_is_reported_and_removed() -> None:
    import builtins

    before = global_state.snapshot(torch)
    builtins.float_ = float  # enum's _convert_ can write any name into any module
    assert global_state.changed(torch, before) == "rebound builtins.float_"
    assert not hasattr(builtins, "float_")
