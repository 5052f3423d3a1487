"""The L2 prefetch of a weight beside the attention: the byte range it asks for, its sm_90
build (bulk prefetches and nothing else), and on the GPU that it changes no value, in a CUDA
graph or out."""

from __future__ import annotations

import pytest
import torch

from loop import l2_prefetch


def test_the_range_starts_at_the_fraction_rounded_down_to_16_bytes() -> None:
    w = torch.empty(100, 7, dtype=torch.bfloat16)  # 1400 bytes
    assert l2_prefetch.byte_range(w, 0.0) == (0, 1400)
    assert l2_prefetch.byte_range(w, 0.5) == (688, 1400)  # 700 rounded down
    assert l2_prefetch.byte_range(w, 0.999) == (1392, 1400)


@pytest.mark.parametrize("first", [-0.1, 1.0, 2.0])
def test_a_fraction_outside_0_to_1_is_refused(first) -> None:
    with pytest.raises(ValueError, match="first must be in"):
        l2_prefetch.byte_range(torch.empty(16), first)


def test_a_strided_tensor_is_refused() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        l2_prefetch.byte_range(torch.empty(8, 8).t(), 0.0)


def test_on_the_cpu_the_join_does_nothing_and_nothing_is_launched() -> None:
    join = l2_prefetch.start(torch.ones(64), 0.25)
    assert join() is None


def test_the_sm90_build_asks_l2_and_touches_no_memory() -> None:
    """Compiled for sm_90 (no GPU needed): one predicated bulk prefetch a lane, no load, no
    store, no wait."""
    from tests.kernels.task_checks import hopper_ptx

    types = {"ptr": "*u8", "start": "i64", "stop": "i64"}
    ptx = hopper_ptx(l2_prefetch._prefetch_l2, types, {"LANE_BYTES": 4096}, 1, 1, ())
    assert ptx.count("cp.async.bulk.prefetch.L2.global") == 1
    body = ptx[ptx.index(".entry") :]
    assert "ld.global" not in body and "st.global" not in body
    assert "griddepcontrol" not in body


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_prefetch_in_a_graph_branch_changes_no_value() -> None:
    """A GEMV after the prefetch of its weight, captured with the branch and its join, gives
    the product bit for bit, on replay too; the weight is untouched."""
    from baselines.timer import GpuTimer

    gen = torch.Generator(device="cuda").manual_seed(3)
    w = torch.randn(4096, 4096, generator=gen, device="cuda").to(torch.bfloat16)
    x = torch.randn(1, 4096, generator=gen, device="cuda").to(torch.bfloat16)
    before = w.clone()
    want = x @ w.t()

    def step():
        join = l2_prefetch.start(w, 0.5)
        y = x @ w.t()
        join()
        return y

    assert torch.equal(step(), want)
    graph, out = GpuTimer("cuda").capture(step)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(w, before)
