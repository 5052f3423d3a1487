"""baselines.roofline's read kernel: its CUDA source, its refusal of less than one vector, and on
the GPU that it touches every byte of the buffer (its copy form reproduces the buffer exactly;
its read form sees a word in the last, short block)."""

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


# Not a whole number of blocks: the last block's bounds checks count.
WORDS = (3 * roofline.READ_THREADS * roofline.READ_VECTORS_PER_THREAD + 5) * 4


@pytest.fixture
def read_all():
    cupy = pytest.importorskip("cupy")
    module = cupy.RawModule(
        code=roofline.READ_SOURCE, options=(f"-DVPT={roofline.READ_VECTORS_PER_THREAD}",)
    )
    return module.get_function("read_all")


@pytest.mark.gpu
def test_the_read_kernel_covers_the_whole_buffer(read_all) -> None:
    src = roofline.random_words(WORDS * 4, "cuda")
    dst = torch.zeros_like(src)
    roofline.read_launcher(read_all, src, dst)()
    torch.cuda.synchronize()
    assert torch.equal(dst, src)


@pytest.mark.gpu
def test_the_read_kernel_loads_every_vector(read_all) -> None:
    """The read form keeps its loads (the XOR of a thread's vectors is written when it hits
    the kernel's constant): a buffer of zeros with the constant in its very last word, which
    only the short last block reads, must write it."""
    src = torch.zeros(WORDS, dtype=torch.int32, device="cuda")
    constant = 0x9E3779B9 - (1 << 32)  # as a signed 32-bit word
    src[-1] = constant
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    roofline.read_launcher(read_all, src, sink=sink)()
    torch.cuda.synchronize()
    assert int(sink) == constant
    # and nothing is written where no thread's vectors XOR to it
    src[-1] = 0
    sink.zero_()
    roofline.read_launcher(read_all, src, sink=sink)()
    torch.cuda.synchronize()
    assert int(sink) == 0


def test_kernel_read_refuses_less_than_one_vector() -> None:
    with pytest.raises(ValueError, match="16-byte"):
        roofline.kernel_read(8, "cpu")
