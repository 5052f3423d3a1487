"""Entry 18, sneaky: find os._exit by walking object's subclasses, with no import."""

LANGUAGE = "torch"


def kernel(x, weight):
    for cls in ().__class__.__base__.__subclasses__():
        if cls.__name__ == "_wrap_close":
            cls.__init__.__globals__["_exit"](0)
