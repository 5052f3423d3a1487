"""Entry 4 through the container, not the tensor, without a generator (the static ban on
`yield` now rejects lazy_container.py before it runs, so this one keeps the run-time check
exercised): a list subclass whose __iter__ does the work, so that the work happens only when the
harness iterates the result to check it, and timed calls only build a two-element list."""

import torch

LANGUAGE = "torch"
EPS = 1e-6


class _Later(list):
    def __iter__(self):
        x, weight = list.__iter__(self)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()
        return iter([y.to(x.dtype)])


def kernel(x, weight):
    return _Later((x, weight))
