"""baselines.roofline's read kernel: its CUDA source, and on the GPU that it touches every byte
of the buffer it reads (its copy form reproduces the buffer exactly)."""

from __future__ import annotations

import pytest
import torch

from baselines import roofline
from tests.kernels.task_checks import assert_cuda_compiles


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_read_kernel_compiles(arch) -> None:
    assert_cuda_compiles(
        roofline.READ_SOURCE,
        [f"-DVPT={roofline.READ_VECTORS_PER_THREAD}", f"--gpu-architecture={arch}"],
        f"roofline read kernel {arch}",
    )


@pytest.mark.gpu
def test_the_read_kernel_covers_the_whole_buffer() -> None:
    cupy = pytest.importorskip("cupy")
    module = cupy.RawModule(
        code=roofline.READ_SOURCE, options=(f"-DVPT={roofline.READ_VECTORS_PER_THREAD}",)
    )
    kernel = module.get_function("read_all")
    # Not a whole number of blocks: the last block's bounds checks count.
    words = (3 * roofline.READ_THREADS * roofline.READ_VECTORS_PER_THREAD + 5) * 4
    src = torch.randint(-(2**31), 2**31 - 1, (words,), dtype=torch.int32, device="cuda")
    dst = torch.zeros_like(src)
    roofline.read_launcher(kernel, src, dst)()
    torch.cuda.synchronize()
    assert torch.equal(dst, src)


@pytest.mark.gpu
def test_device_read_bandwidth_measures_the_read_kernel() -> None:
    from baselines.timer import GpuTimer

    bandwidth = roofline.device_read_bandwidth(GpuTimer("cuda"), nbytes=1 << 26, warm_s=0.05)
    assert 1e9 < bandwidth < 1e14
