"""One forked worker child and what the parent makes of its pipe: the harness's lines carry a
token the child's other code does not know, so forged or spoiled lines make a crash, not a
result."""

from __future__ import annotations

import os

from loop.worker_child import Channel, run_child


def honest(chan: Channel) -> dict:
    chan.mark("candidate", "shape-a")
    return {"answer": 42}


def test_the_harness_lines_make_the_result() -> None:
    outcome = run_child(honest, 30)
    assert outcome.failure is None and outcome.result == {"answer": 42}
    assert outcome.last_mark == ("candidate", "shape-a")


def test_a_forged_result_line_makes_a_crash() -> None:
    def forger(chan: Channel) -> dict:
        chan.mark("candidate", "shape-a")
        os.write(chan.fd, b'{"result": {"answer": 1}}\n')  # what candidate code can write
        return {"answer": 42}

    outcome = run_child(forger, 30)
    assert outcome.result is None and outcome.failure == "crash"
    assert "did not write" in outcome.message
    assert outcome.last_mark == ("candidate", "shape-a")


def test_a_fragment_that_spoils_the_real_result_makes_a_crash() -> None:
    def spoiler(chan: Channel) -> dict:
        os.write(chan.fd, b'{"pad": "')  # the harness's next line is glued onto this
        return {"answer": 42}

    outcome = run_child(spoiler, 30)
    assert outcome.result is None and outcome.failure == "crash"


def test_a_forged_mark_is_not_believed() -> None:
    def framer(chan: Channel) -> dict:
        chan.mark("candidate", "shape-a")
        os.write(chan.fd, b'{"mark": ["peer", "shape-a"]}\n')
        os.abort()

    outcome = run_child(framer, 30)
    assert outcome.failure == "crash"
    assert outcome.last_mark == ("candidate", "shape-a")
