LANGUAGE = "torch"


def kernel(x, weight):
    raise RuntimeError("boom")
