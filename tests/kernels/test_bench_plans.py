"""The GPU bench plans of scripts/bench_tasks_gpu.py name real shapes and parameters: a typo
there costs device time (the evaluator rejects the configuration with bad-params) and is only
seen on the GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from loop.evaluator import read_params_space, validate_params
from loop.tasks import load_task

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_tasks_gpu.py"


def _plans():
    spec = importlib.util.spec_from_file_location("bench_tasks_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_plan_names_shapes_and_parameters_its_task_has() -> None:
    module = _plans()
    problems = []
    for plan in module.PLANS:
        task = load_task(plan.task)
        names = {s.name for s in task.shapes("cuda")}
        extra = module.E2E_SHAPES.get(plan.task, [])
        problems += [
            f"{plan.stem('')}: no shape {s}" for s in [*plan.shapes, *extra] if s not in names
        ]
        path = task.folder / plan.candidate
        space = read_params_space(path.read_text())
        for params in plan.configs:
            problems += [
                f"{plan.stem('')} {params}: {r.message}"
                for r in validate_params(path, params, space)
            ]
    assert problems == []


def test_a_value_outside_params_is_reported() -> None:
    path = load_task("softmax").folder / "cupy_softmax_resident.py"
    space = read_params_space(path.read_text())
    assert validate_params(path, {"threads": 256, "rows_per_cluster": 3}, space)
    assert not validate_params(path, {"threads": 256, "rows_per_cluster": 2}, space)
