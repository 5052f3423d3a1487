"""Cross-entropy in PyTorch, chunked over rows; a small __slots__ class is the key of a cache of
scratch buffers (with __eq__/__hash__/__repr__), reused across calls of one shape."""

import torch

LANGUAGE = "torch"
PARAMS = {"chunk_rows": [0, 64]}
IGNORE = -100


class _Key:
    __slots__ = ("device", "rows", "vocab")

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.rows = rows
        self.vocab = vocab
        self.device = device

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and (self.rows, self.vocab, self.device) == (
            other.rows,
            other.vocab,
            other.device,
        )

    def __hash__(self) -> int:
        return hash((self.rows, self.vocab, str(self.device)))

    def __repr__(self) -> str:
        return f"_Key({self.rows}, {self.vocab}, {self.device})"


_SCRATCH: dict[_Key, torch.Tensor] = {}


def kernel(logits: torch.Tensor, targets: torch.Tensor, chunk_rows: int = 0) -> torch.Tensor:
    rows, vocab = logits.shape
    key = _Key(rows, vocab, logits.device)
    if key not in _SCRATCH:
        _SCRATCH[key] = logits.new_empty((rows,), dtype=torch.float32)
    loss = _SCRATCH[key]
    step = chunk_rows or rows
    for start in range(0, rows, step):
        lf = logits[start : start + step].float()
        t = targets[start : start + step]
        mx = lf.amax(dim=-1, keepdim=True)
        lse = (lf - mx).exp().sum(-1).log() + mx.squeeze(-1)
        valid = t != IGNORE
        picked = lf.gather(1, t.clamp(min=0)[:, None]).squeeze(1)
        loss[start : start + step] = torch.where(valid, lse - picked, torch.zeros_like(lse))
    return loss.clone()
