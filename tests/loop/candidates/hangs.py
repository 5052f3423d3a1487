LANGUAGE = "torch"


def kernel(x, weight):
    while True:
        x = x + 0
