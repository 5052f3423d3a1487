"""Entry 18: kill the worker with a segfault (a numpy view far past its buffer), passing every
static check."""

import numpy

LANGUAGE = "torch"


def kernel(x, weight):
    base = numpy.zeros(1)
    wild = numpy.lib.stride_tricks.as_strided(base, shape=(1 << 20,), strides=(1 << 40,))
    return x * float(wild.sum())
