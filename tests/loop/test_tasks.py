"""loop/tasks.py: a shape's ragged twin, where candidates are verified beside the shape."""

from __future__ import annotations

from loop.tasks import load_task


def test_the_ragged_twin_adds_a_drawn_length_to_the_bucket_key() -> None:
    task = load_task("gqa_decode")
    shape = next(s for s in task.shapes("cuda") if s.name == "b1-kv4096")
    twins = [task.ragged_twin(shape, draw) for draw in range(5000)]
    extras = {t.dims["kv_len"] - 4096 for t in twins}
    assert extras == set(range(1, 4097))  # every length up to the shape's own, by the draw
    long = next(s for s in task.shapes("cuda") if s.name == "b1-kv131072")
    assert max(task.ragged_twin(long, d).dims["kv_len"] for d in range(9000)) == 131072 + 8191
    twin = twins[7]
    assert twin.name == f"b1-kv4096+{twin.dims['kv_len'] - 4096}" == twin.dims["name"]
    assert {k: v for k, v in twin.dims.items() if k not in ("kv_len", "name")} == {
        k: v for k, v in shape.dims.items() if k not in ("kv_len", "name")
    }


def test_no_twin_without_a_tail_or_past_the_tasks_limit() -> None:
    rmsnorm = load_task("rmsnorm")
    assert rmsnorm.ragged_twin(rmsnorm.shapes("cpu")[0], 3) is None
    prefill = load_task("prefill_attention")
    by_kv = {s.dims["kv_len"]: s for s in prefill.shapes("cuda")}
    assert prefill.ragged_twin(by_kv[8192], 3) is not None
    assert prefill.ragged_twin(by_kv[65536], 3) is None  # RAGGED_UP_TO 8192
