"""Softmax from elementary torch ops, with a self-test a developer runs by hand."""

import torch

LANGUAGE = "torch"
PARAMS = {"chunk_rows": [0, 64]}


@torch.no_grad()
def kernel(x: torch.Tensor, chunk_rows: int = 0) -> torch.Tensor:
    if chunk_rows <= 0:
        chunk_rows = x.shape[0]
    y = torch.empty_like(x)
    for start in range(0, x.shape[0], chunk_rows):
        xf = x[start : start + chunk_rows].float()
        e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
        y[start : start + chunk_rows] = (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
    return y


if __name__ == "__main__":
    import time

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(64, 32000, device=device, dtype=torch.bfloat16)
    want = torch.exp(x.double()) / torch.exp(x.double()).sum(-1, keepdim=True)
    torch.testing.assert_close(kernel(x).double(), want, atol=1e-2, rtol=1e-2)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        kernel(x)
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"{(time.perf_counter() - t0) / 10 * 1e6:.1f} us")
