"""Entry 18: hang the worker."""

LANGUAGE = "torch"


def kernel(x, weight):
    while True:
        x = x + 0
