"""A torch.compile peer specialised per shape must stay compiled on every shape of a task: past
dynamo's default recompile limit (8) it would silently fall back to eager, and the harness
would report a peer slower than the user gets."""

from __future__ import annotations

import textwrap

from loop.evaluator import evaluate
from loop.tasks import load_task

TASK = textwrap.dedent(
    """
    import torch

    SHAPES = {"cpu": [{"name": f"s{n}", "n": n, "dtype": "float32"} for n in range(3, 15)]}
    TOLERANCE = {"float32": 1e-6}


    def make_inputs(shape, seed, device):
        gen = torch.Generator(device=device).manual_seed(seed)
        return (torch.randn(shape["n"], generator=gen, device=device) + 3.0,)


    def reference(x):
        return x * 2.0


    def bytes_moved(shape):
        return 8 * shape["n"]


    def flops(shape):
        return shape["n"]


    def _doubled_only_when_compiled(x):
        # Traced by dynamo: doubles. Run eagerly after a fallback: triples, and fails.
        return x * (2.0 if torch.compiler.is_compiling() else 3.0)


    _compiled = torch.compile(_doubled_only_when_compiled, dynamic=False, backend="eager")


    def compiled(x):
        return _compiled(x)


    PEERS = {"torch.compile": compiled}
    """
)


def test_a_compiled_peer_stays_compiled_on_more_shapes_than_dynamos_default_limit(tmp_path) -> None:
    folder = tmp_path / "manyshapes"
    folder.mkdir()
    (folder / "task.py").write_text(TASK)
    task = load_task(str(folder))
    assert len(task.shapes("cpu")) > 8
    ev = evaluate(task, [], "cpu", peers=["torch.compile"])
    peer = ev.by_label("torch.compile")
    assert peer.accepted, peer.reasons
    assert len(peer.shapes) == len(task.shapes("cpu"))
