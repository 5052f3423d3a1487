"""GPU smoke test behind `nix run .#gpu-smoke`: NVML sees the GPU and torch multiplies on it.

Run by the Nix wrapper after the driver was found, so a failure here means the pinned
userspace and the host's driver do not work together. Exit 0 when both parts pass, 1 otherwise.
Read-only: it never changes a GPU setting.
"""

from __future__ import annotations

import sys


def nvml_report() -> list[str]:
    """One line for the driver and one per GPU, read through NVML."""
    import pynvml

    pynvml.nvmlInit()
    try:
        lines = [f"driver {pynvml.nvmlSystemGetDriverVersion()}"]
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            lines.append(
                f"gpu {index}: {pynvml.nvmlDeviceGetName(handle)}, "
                f"{memory.total / 2**30:.0f} GiB, "
                f"compute capability {'.'.join(map(str, pynvml.nvmlDeviceGetCudaComputeCapability(handle)))}"
            )
        return lines
    finally:
        pynvml.nvmlShutdown()


def torch_matmul(n: int = 1024) -> str:
    """Multiply two n x n float32 matrices on the GPU and compare with the CPU."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device (torch.cuda.is_available() is False)")
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator, dtype=torch.float64)
    b = torch.randn(n, n, generator=generator, dtype=torch.float64)
    expected = a @ b
    got = (a.float().cuda() @ b.float().cuda()).double().cpu()
    error = ((got - expected).abs().max() / expected.abs().max()).item()
    if error > 1e-2:
        raise RuntimeError(f"{n}x{n} matmul on the GPU is off by {error:.2e} (relative)")
    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) on "
        f"{torch.cuda.get_device_name(0)}: {n}x{n} matmul ok, max relative error {error:.1e}"
    )


def main() -> int:
    """Run both parts; report every failure, not only the first."""
    failed = False
    for name, part in (("nvml", nvml_report), ("torch", lambda: [torch_matmul()])):
        try:
            for line in part():
                print(f"gpu-smoke: {name}: {line}")
        except Exception as exc:  # a smoke test reports any failure as a line
            print(f"gpu-smoke: {name}: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed = True
    print("gpu-smoke: " + ("FAILED" if failed else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
