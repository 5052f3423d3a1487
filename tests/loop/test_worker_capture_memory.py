"""How many CUDA graphs a runner's blocks rotate through at a shape: eight, fewer where one
capture holds much memory (its outputs, or for a peer the intermediates its graph's pool keeps),
so that a peer that upcasts a large batch cannot fill the GPU before the re-verification draws
its reference. A candidate's pool does not count: scratch it never uses must not buy it out of
the averaging over captures."""

from __future__ import annotations

import textwrap

import pytest

from loop.evaluator import CandidateSpec, evaluate
from loop.tasks import load_task
from loop.worker import CAPTURE_BYTES, capture_count


def test_small_captures_get_every_slot() -> None:
    assert capture_count(4096, 2 << 20, 8) == 8


def test_a_capture_holding_much_memory_gets_fewer_slots() -> None:
    assert capture_count(4096, CAPTURE_BYTES // 3, 8) == 3
    # outputs count as much as what the pool holds
    assert capture_count(CAPTURE_BYTES // 2, 0, 8) == 2


def test_a_capture_larger_than_the_budget_still_gets_one() -> None:
    assert capture_count(4096, 10 * CAPTURE_BYTES, 8) == 1
    assert capture_count(0, 0, 8) == 8


# A peer that spreads its 64 MiB input into 2 GiB of float64 inside its graph's pool before
# answering; the candidate writes its answer without an intermediate.
TASK = textwrap.dedent(
    """
    import torch

    SHAPES = {"cuda": [{"name": "n16m", "n": 1 << 24, "dtype": "float32"}]}
    TOLERANCE = {"float32": 1e-6}


    def make_inputs(shape, seed, device):
        gen = torch.Generator(device=device).manual_seed(seed)
        return (torch.randn(shape["n"], generator=gen, device=device),)


    def reference(x):
        return x * 2.0


    def bytes_moved(shape):
        return 8 * shape["n"]


    def flops(shape):
        return shape["n"]


    def upcasting(x):
        wide = x.double().expand(16, -1).contiguous()
        return (wide[0] * 2.0).float()


    PEERS = {"upcasting": upcasting}
    """
)

CANDIDATE = textwrap.dedent(
    """
    import torch

    LANGUAGE = "torch"


    def kernel(x):
        return x * 2.0
    """
)

# A candidate that allocates 1 GiB of scratch it never reads in every call.
SCRATCHY = textwrap.dedent(
    """
    import torch

    LANGUAGE = "torch"


    def kernel(x):
        scratch = torch.empty(1 << 28, device=x.device)
        del scratch
        return x * 2.0
    """
)


@pytest.mark.gpu
def test_a_peer_whose_graph_holds_much_memory_is_captured_fewer_times(tmp_path) -> None:
    from baselines import timer

    folder = tmp_path / "capture_memory"
    folder.mkdir()
    (folder / "task.py").write_text(TASK)
    (folder / "double.py").write_text(CANDIDATE)
    (folder / "scratchy.py").write_text(SCRATCHY)
    task = load_task(str(folder))
    rule = {"samples_per_block": 3, "min_blocks": 4, "max_blocks": 6, "warmup": 1}
    ev = evaluate(
        task,
        [
            CandidateSpec(folder / "double.py", {}, "double"),
            CandidateSpec(folder / "scratchy.py", {}, "scratchy"),
        ],
        "cuda",
        time_it=True,
        peers=["upcasting"],
        rule=rule,
    )
    candidate = ev.by_label("double")
    assert candidate.accepted, candidate.reasons
    peer = next(v for v in ev.verdicts if v.kind == "peer")
    # 64 MiB of output each: every slot fits the budget.
    assert candidate.shapes["n16m"].captures == timer.CAPTURE_SLOTS
    # Over 2 GiB in its pool: one capture.
    assert peer.shapes["n16m"].captures == 1
    # 1 GiB of scratch in its pool, but a candidate is counted by its outputs.
    scratchy = ev.by_label("scratchy")
    assert scratchy.accepted, scratchy.reasons
    assert scratchy.shapes["n16m"].captures == timer.CAPTURE_SLOTS
