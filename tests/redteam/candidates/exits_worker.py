"""Entry 18: end the worker process from inside the call."""

import os

LANGUAGE = "torch"


def kernel(x, weight):
    os._exit(0)
