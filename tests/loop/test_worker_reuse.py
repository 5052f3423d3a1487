"""The worker process is kept between evaluations: a second evaluation is served by the same
worker, while every candidate still runs in a freshly forked child of its own process group.
A candidate's death costs only itself; a worker that dies, between or during evaluations, is
replaced; concurrent evaluations never share a worker; AUTOTUNE_WORKER_REUSE=0 restores one
worker per evaluation."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from loop.evaluator import TRUST_INTERPRETER_ENV, CandidateSpec, Limits, evaluate
from loop.tasks import load_task
from loop.worker_child import run_child
from loop.worker_pool import REUSE_ENV, prestart_worker, shutdown_workers

REDTEAM = Path(__file__).parent.parent / "redteam" / "candidates"
HERE = Path(__file__).parent / "candidates"
SHAPES = ["decode-7x256"]


@pytest.fixture(autouse=True)
def reuse_on(monkeypatch):
    monkeypatch.delenv(REUSE_ENV, raising=False)


@pytest.fixture(scope="module", autouse=True)
def no_workers_left():
    yield
    shutdown_workers()


@pytest.fixture(scope="module")
def task():
    return load_task("rmsnorm")


def honest(task) -> CandidateSpec:
    return CandidateSpec(task.folder / "torch_rmsnorm.py", {}, "honest")


def codes(verdict) -> set[str]:
    return {r.code for r in verdict.reasons}


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_two_evaluations_in_a_row_share_one_worker(task) -> None:
    shutdown_workers()
    first = evaluate(task, [honest(task)], "cpu", shapes=SHAPES)
    second = evaluate(task, [honest(task)], "cpu", shapes=SHAPES)
    assert first.verdicts[0].accepted and second.verdicts[0].accepted
    assert first.phases["worker_reused"] is False
    assert second.phases["worker_reused"] is True
    assert first.worker_pid == second.worker_pid
    assert not dead(second.worker_pid)


def test_a_prestarted_worker_serves_the_next_evaluation(task) -> None:
    shutdown_workers()
    pid = prestart_worker("cpu")
    assert pid is not None and prestart_worker("cpu") == pid
    ev = evaluate(task, [honest(task)], "cpu", shapes=SHAPES)
    assert ev.verdicts[0].accepted, ev.verdicts[0].reasons
    assert ev.worker_pid == pid


def test_a_segfault_costs_only_its_candidate_and_the_worker_serves_on(task, monkeypatch) -> None:
    monkeypatch.setenv(TRUST_INTERPRETER_ENV, "1")  # the segfault is a Triton wild store
    crash = CandidateSpec(REDTEAM / "segfaults.py", {}, "segfault")
    ev = evaluate(task, [crash, honest(task)], "cpu", shapes=SHAPES)
    assert codes(ev.by_label("segfault")) == {"crash"}
    assert ev.by_label("honest").accepted, ev.by_label("honest").reasons
    after = evaluate(task, [honest(task)], "cpu", shapes=SHAPES)
    assert after.verdicts[0].accepted, after.verdicts[0].reasons
    assert after.worker_pid == ev.worker_pid
    assert after.phases["worker_reused"] is True


def test_a_worker_killed_between_evaluations_is_replaced(task) -> None:
    first = evaluate(task, [honest(task)], "cpu", shapes=SHAPES)
    os.kill(first.worker_pid, signal.SIGKILL)
    wait_until(lambda: dead(first.worker_pid))
    second = evaluate(task, [honest(task)], "cpu", shapes=SHAPES)
    assert second.verdicts[0].accepted, second.verdicts[0].reasons
    assert second.worker_pid != first.worker_pid
    assert second.phases["worker_reused"] is False


def test_a_worker_killed_during_an_evaluation_takes_its_children_along(task) -> None:
    """The hanging candidate's child leads its own process group; when the worker dies, the
    evaluator kills that group too, rejects the evaluation, and the next one gets a new worker."""
    warm = evaluate(task, [honest(task)], "cpu", shapes=SHAPES)
    worker = psutil.Process(warm.worker_pid)
    done: dict = {}
    hang = CandidateSpec(HERE / "hangs.py", {}, "hangs")
    thread = threading.Thread(
        target=lambda: done.update(
            ev=evaluate(task, [hang], "cpu", shapes=SHAPES, limits=Limits(timeout_s=120))
        )
    )
    thread.start()

    def own_group_children() -> list[psutil.Process]:
        # between fork and setpgid a child is briefly still in the worker's group
        out = []
        for c in worker.children():
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                if os.getpgid(c.pid) == c.pid:
                    out.append(c)
        return out

    wait_until(lambda: bool(own_group_children()))
    child = own_group_children()[0]
    assert os.getpgid(child.pid) == child.pid != os.getpgid(worker.pid)
    worker.kill()
    thread.join(60)
    assert not thread.is_alive()
    verdict = done["ev"].by_label("hangs")
    assert not verdict.accepted
    assert codes(verdict) <= {"crash", "out-of-memory"}, verdict.reasons
    wait_until(lambda: dead(child.pid))
    after = evaluate(task, [honest(task)], "cpu", shapes=SHAPES)
    assert after.verdicts[0].accepted, after.verdicts[0].reasons
    assert after.worker_pid != warm.worker_pid


def test_concurrent_evaluations_each_have_a_worker(task) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        evs = list(
            pool.map(lambda _: evaluate(task, [honest(task)], "cpu", shapes=SHAPES), range(6))
        )
    assert all(ev.verdicts[0].accepted for ev in evs), [ev.verdicts[0].reasons for ev in evs]
    assert len({ev.worker_pid for ev in evs}) <= 2
    assert any(ev.phases["worker_reused"] for ev in evs)


def test_reuse_can_be_turned_off(task, monkeypatch) -> None:
    monkeypatch.setenv(REUSE_ENV, "0")
    assert prestart_worker("cpu") is None
    evs = [evaluate(task, [honest(task)], "cpu", shapes=SHAPES) for _ in range(2)]
    assert all(ev.verdicts[0].accepted for ev in evs)
    assert evs[0].worker_pid != evs[1].worker_pid
    assert not any(ev.phases["worker_reused"] for ev in evs)
    assert all(dead(ev.worker_pid) for ev in evs)


def test_each_evaluation_loads_the_task_afresh(task, tmp_path) -> None:
    folder = tmp_path / "mytask"
    shutil.copytree(task.folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    spec = CandidateSpec(folder / "torch_rmsnorm.py", {}, "c")
    before = evaluate(load_task(folder), [spec], "cpu", shapes=SHAPES)
    assert before.verdicts[0].accepted, before.verdicts[0].reasons
    with (folder / "task.py").open("a") as fh:
        fh.write("\n\ndef reference(x, weight):\n    return x * 3.0\n")
    after = evaluate(load_task(folder), [spec], "cpu", shapes=SHAPES)
    assert after.worker_pid == before.worker_pid
    assert codes(after.verdicts[0]) == {"mismatch"}, after.verdicts[0].reasons


def test_a_child_takes_what_it_started_along() -> None:
    """Whatever a child starts is in the child's process group, killed when the child ends."""
    read_fd, write_fd = os.pipe()

    def body(chan) -> dict:
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        os.write(write_fd, f"{pid}\n".encode())
        return {"grandchild": pid}

    outcome = run_child(body, 60)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        grandchild = int(pipe.readline())
    assert outcome.result == {"grandchild": grandchild}
    wait_until(lambda: dead(grandchild))


@pytest.mark.gpu
def test_a_gpu_worker_is_reused_and_never_touches_cuda() -> None:
    task = load_task("rmsnorm")
    spec = CandidateSpec(task.folder / "triton_rmsnorm.py", {}, "triton")
    shape = [task.shapes("cuda")[0].name]
    first = evaluate(task, [spec], "cuda", shapes=shape)
    second = evaluate(task, [spec], "cuda", shapes=shape, time_it=True, peers=["eager"])
    for ev in (first, second):
        assert all(v.accepted for v in ev.verdicts), [v.reasons for v in ev.verdicts]
    assert second.worker_pid == first.worker_pid
    assert second.phases["worker_reused"] is True


def test_a_request_slipped_into_an_idle_worker_costs_no_evaluation(task) -> None:
    """Something (a candidate's leftover process, say) writes a request of its own into an idle
    worker's input: the next evaluation gets an answer that is not its own, and is then served
    by a fresh worker instead of failing."""
    from loop import worker_pool

    first = evaluate(task, [honest(task)], "cpu", shapes=SHAPES)
    [idle] = [w for w in worker_pool._idle if w.proc.pid == first.worker_pid]
    fake = {**first.phases, "nonce": "forged", "task": str(task.folder), "device": "cpu"}
    fake.update(candidates=[], peers=[], shapes=SHAPES, time=False, secret=1, harness=".")
    idle.proc.stdin.write((json.dumps(fake) + "\n").encode())
    idle.proc.stdin.flush()
    second = evaluate(task, [honest(task)], "cpu", shapes=SHAPES)
    assert second.by_label("honest").accepted, second.by_label("honest").reasons
    assert second.worker_pid != first.worker_pid


def test_input_left_over_after_a_request_is_dropped_and_the_worker_retires() -> None:
    from loop.worker_serve import _Requests

    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b'{"a": 1}\n{"forged": true}\npartial')
        requests = _Requests(read_fd)
        assert requests.readline() == b'{"a": 1}\n'
        assert requests.drain() is True
        assert requests.drain() is False
        os.write(write_fd, b'{"b": 2}\n')
        assert requests.readline() == b'{"b": 2}\n'
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_only_groups_led_by_the_workers_children_are_ever_killed() -> None:
    from loop.worker_child import kill_group
    from loop.worker_pool import _is_child_group

    child = psutil.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert _is_child_group(child.pid, os.getpid())  # led by a child of "the worker" (us)
        assert not _is_child_group(child.pid, child.pid + 1)  # not that worker's child
        for bogus in (0, 1, -5, os.getpgrp(), os.getpid(), True, "7", 2.0):
            assert not _is_child_group(bogus, os.getpid())
        kill_group(0)  # would be this process's own group: refused, and we are still here
        kill_group(os.getpgrp())
        assert child.is_running()
    finally:
        child.kill()
        child.wait()
