"""Entry 18: allocate host memory until the machine gives out."""

LANGUAGE = "torch"


def kernel(x, weight):
    hog = []
    while True:
        hog.append(bytearray(1 << 28))
