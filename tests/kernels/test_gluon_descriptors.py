"""The Gluon GEMM candidates' TMA descriptors (CPU: a descriptor is built without a GPU)."""

from __future__ import annotations

import pytest
import torch

from loop.tasks import load_task
from tests.kernels.task_checks import candidate_module


@pytest.mark.parametrize(
    "task_name, candidate",
    [
        ("linear_residual", "gluon_gemm_residual.py"),
        ("rmsnorm_linear_rope", "gluon_rmsnorm_gemm_rope.py"),
        ("rmsnorm_linear_swiglu", "gluon_rmsnorm_gemm_swiglu.py"),
    ],
)
def test_a_single_row_with_any_stride_gets_a_descriptor(task_name, candidate) -> None:
    """torch calls a one-row matrix contiguous whatever its row stride, so `.contiguous()` keeps
    a stride TMA cannot take (not a multiple of 16 bytes); the descriptor takes the row's width
    instead, where TensorDescriptor would raise an AssertionError, which the block's fallback
    to eager (it catches ValueError) would not catch."""
    module = candidate_module(load_task(task_name), candidate)
    row = torch.zeros(1, 64, dtype=torch.bfloat16).as_strided((1, 64), (3, 1))
    assert row.is_contiguous() and row.contiguous().stride() == (3, 1)
    assert list(module._descriptor(row, 16).strides) == [64, 1]
    rows = torch.zeros(4, 72, dtype=torch.bfloat16)
    assert list(module._descriptor(rows, 16).strides) == [72, 1]
