"""Cross-entropy per row in Triton: the row's (max, sum of exp) by a tl.reduce over a pair with
a custom combine, the target logit picked with one load; ignored rows give 0."""

import torch
import triton
import triton.language as tl

LANGUAGE = "triton"
PARAMS = {"block": [2048, 4096, 8192], "num_warps": [4, 8, 16]}
IGNORE_INDEX = -100


@triton.jit
def _combine(m1, s1, m2, s2):
    m = tl.maximum(m1, m2)
    return m, s1 * tl.exp(m1 - m) + s2 * tl.exp(m2 - m)


@triton.jit
def _xent(logits_ptr, targets_ptr, loss_ptr, V, stride, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    base = logits_ptr + row * stride
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        mask = start + offs < V
        x = tl.load(base + start + offs, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp(tl.where(m == float("-inf"), 0.0, m - m_new)) + tl.where(
            mask, tl.exp(x - m_new), 0.0
        )
        m = m_new
    row_m, row_s = tl.reduce((m, s), 0, _combine)
    target = tl.load(targets_ptr + row)
    valid = target != ignore_index
    picked = tl.load(base + tl.where(valid, target, 0)).to(tl.float32)
    loss = row_m + tl.log(row_s) - picked
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))


def kernel(logits: torch.Tensor, targets: torch.Tensor, block: int = 4096, num_warps: int = 8):
    rows, vocab = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _xent[(rows,)](
        logits,
        targets,
        loss,
        vocab,
        logits.stride(0),
        IGNORE_INDEX,
        BLOCK=min(block, triton.next_power_of_2(vocab)),
        num_warps=num_warps,
    )
    return loss
