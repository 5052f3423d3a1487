"""No false rejections: every task's shipped candidates pass on 20 fresh secret seeds and every
shape class; on the CPU the torch ones (all CPU shapes, which are tiny), on the GPU all of them
(the smallest shape of each class, to bound the float64 references). The GPU test is one test a
task, so that a run cut short by a time limit still says which tasks passed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from loop.evaluator import CandidateSpec, evaluate, static_verdict
from loop.tasks import available_tasks, load_task

SEEDS = 20


def _shipped(task, device: str, languages: tuple[str, ...] | None) -> list[CandidateSpec]:
    specs = []
    for path in task.candidate_paths(device):
        spec = CandidateSpec(path, {}, path.name)
        language, _ = static_verdict(task, spec)
        if languages is None or language in languages:
            specs.append(spec)
    return specs


def _smallest_per_class(task, device: str) -> list[str]:
    best: dict[str, tuple[int, str]] = {}
    for shape in task.shapes(device):
        size = sum(v for v in shape.dims.values() if isinstance(v, int))
        if shape.shape_class not in best or size < best[shape.shape_class][0]:
            best[shape.shape_class] = (size, shape.name)
    return [name for _, name in best.values()]


def _rejections(name: str, device: str, languages, smallest: bool) -> list[str]:
    task = load_task(name)
    specs = _shipped(task, device, languages)
    if not specs:
        return []
    shapes = _smallest_per_class(task, device) if smallest else None
    ev = evaluate(task, specs, device, shapes=shapes, seeds=SEEDS)
    problems = []
    for verdict in ev.verdicts:
        if not verdict.accepted:
            problems.append(f"{name}/{verdict.label}: {verdict.reasons}")
        elif shapes is None and set(verdict.shapes) != {s.name for s in task.shapes(device)}:
            problems.append(f"{name}/{verdict.label}: not every shape verified")
    return problems


def test_shipped_torch_candidates_pass_twenty_seeds_on_the_cpu() -> None:
    tasks = available_tasks()
    assert tasks
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = pool.map(lambda n: _rejections(n, "cpu", ("torch",), False), tasks)
    problems = [p for batch in found for p in batch]
    assert not problems, "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize("name", available_tasks())
def test_every_shipped_candidate_passes_twenty_seeds_on_the_gpu(name: str) -> None:
    problems = _rejections(name, "cuda", None, True)
    assert not problems, "\n".join(problems)
