"""Entry 18 on the GPU: kill the worker child with a segfault after touching the GPU."""

import numpy

LANGUAGE = "torch"


def kernel(x, weight):
    y = x * 2
    base = numpy.zeros(1)
    wild = numpy.lib.stride_tricks.as_strided(base, shape=(1 << 20,), strides=(1 << 40,))
    return y * float(wild.sum())
