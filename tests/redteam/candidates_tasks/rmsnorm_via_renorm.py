"""Entry 12: RMSNorm by the library's renorm: each row scaled up by 2**20 (exactly) so that its
2-norm passes maxnorm = sqrt(hidden), which renorm then rescales it to: x / rms(x)."""

import math

LANGUAGE = "torch"


def kernel(x, weight):
    h = x.shape[-1]
    rows = (x.reshape(-1, h).float() * 2.0**20).renorm(2, 0, math.sqrt(h))
    return (rows.reshape(x.shape) * weight.float()).to(x.dtype)
