"""The GPU bench plans of scripts/bench_tasks_gpu.py and scripts/bench_attention_gemm_gpu.sh name
real shapes and parameters: a typo there costs device time (the evaluator rejects the
configuration with bad-params) and is only seen on the GPU."""

from __future__ import annotations

import inspect
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from loop.evaluator import read_params_space, validate_params
from loop.tasks import load_task
from tests.kernels.task_checks import GLUON_X_G_EVALUATED, fit_an_sm
from tests.source_files import import_file

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _shell_plans(text: str) -> list[tuple[str, str, list[str], list[dict]]]:
    """(task, candidate, shapes, configs) of every `bench`, `sweep` and `bench_best` line of the
    shell script (continuation lines joined; shapes and configs that are shell variables
    skipped, and so are the calls inside the script's own helpers, whose task is one). A sweep's
    config written FILE{...} (another candidate file) is a plan of its own."""
    plans = []
    for line in text.replace("\\\n", " ").splitlines():
        words = line.split(maxsplit=1)
        if len(words) < 2 or words[0] not in ("bench", "sweep", "bench_best"):
            continue
        args = shlex.split(words[1])
        if args[0].startswith("$"):
            continue
        if words[0] == "bench":  # task candidate tag params peers shapes...
            shapes, configs = args[5:], [args[3]]
        elif words[0] == "bench_best":  # task candidate sweep-tag shapes...
            shapes, configs = args[3:], []
        else:  # task candidate tag peer shapes,... configs...
            shapes, configs = args[4].split(","), args[5:]
            others = [c for c in configs if not c.startswith(("{", "$"))]
            configs = [c for c in configs if c not in others]
            for c in others:
                file, brace, params = c.partition("{")
                assert brace, f"{args[0]} {args[1]}: config {c!r} is not {{...}} nor FILE{{...}}"
                listed = [s for s in shapes if not s.startswith("$")]
                plans.append((args[0], file, listed, [json.loads(brace + params)]))
        shapes = [s for s in shapes if not s.startswith("$")]
        configs = [json.loads(c) for c in configs if not c.startswith("$")]
        plans.append((args[0], args[1], shapes, configs))
    return plans


def _problems(task_name: str, candidate: str, shapes: list[str], configs: list[dict]) -> list[str]:
    """Shapes the task lacks and parameters the candidate's PARAMS refuse, one line each."""
    task = load_task(task_name)
    names = {s.name for s in task.shapes("cuda")}
    where = f"{task_name} {candidate}"
    found = [f"{where}: no shape {s}" for s in shapes if s not in names]
    path = task.folder / candidate
    space = read_params_space(path.read_text())
    for params in configs:
        found += [f"{where} {params}: {r.message}" for r in validate_params(path, params, space)]
    return found


def test_every_python_plan_names_shapes_and_parameters_its_task_has() -> None:
    module = import_file(SCRIPTS / "bench_tasks_gpu.py")
    problems = []
    for plan in module.PLANS:
        extra = module.E2E_SHAPES.get(plan.task, [])
        problems += _problems(plan.task, plan.candidate, [*plan.shapes, *extra], plan.configs)
        for rival, params in plan.rivals:
            problems += _problems(plan.task, rival, [], [params])
    assert problems == []


def test_every_shell_plan_names_shapes_and_parameters_its_task_has() -> None:
    plans = _shell_plans((SCRIPTS / "bench_attention_gemm_gpu.sh").read_text())
    assert {p[0] for p in plans} >= {"skinny_gemm", "gqa_decode", "mla_decode", "fp8_gemm"}
    assert sum(len(p[3]) for p in plans if p[0] == "mla_decode") >= 10
    problems = []
    for plan in plans:
        problems += _problems(*plan)
    assert problems == []


def test_a_value_outside_params_or_an_unknown_shape_is_reported() -> None:
    script = """
        sweep mla_decode triton_mla_decode.py sweep eager b1-kv131072,b2-kv7,"$more" \\
            '{"block_h":64}' \\
            '{"block_h":128,"block_n":64}' 'gluon_mla_decode.py{"block_n":48}'
    """
    plans = _shell_plans(script)
    assert plans == [
        ("mla_decode", "gluon_mla_decode.py", ["b1-kv131072", "b2-kv7"], [{"block_n": 48}]),
        (
            "mla_decode",
            "triton_mla_decode.py",
            ["b1-kv131072", "b2-kv7"],
            [{"block_h": 64}, {"block_h": 128, "block_n": 64}],
        ),
    ]
    problems = _problems(*plans[1])
    assert len(problems) == 2
    assert "no shape b2-kv7" in problems[0] and "block_h=128" in problems[1]
    problems = _problems(*plans[0])
    assert len(problems) == 2
    assert "no shape b2-kv7" in problems[0] and "block_n=48" in problems[1]


def _gluon_configs_too_big(task_name: str, candidate: str, at: dict[str, list[dict]]) -> list[str]:
    """What of `at` (shape name -> configurations, the kernel's defaults filling what one leaves
    out) a Gluon kernel would refuse for want of shared memory, or could not fit
    `programs_per_sm` times into an SM's, a line each. The kernel's `shared_bytes` takes what it
    names of k, block_k, split_k and stages (the x g kernels' depends on K, the residual's not)."""
    task = load_task(task_name)
    kernel = import_file(task.folder / candidate)
    signature = inspect.signature(kernel.kernel).parameters
    names = ("block_k", "split_k", "num_stages", "programs_per_sm")
    defaults = {name: signature[name].default for name in names}
    needs = inspect.signature(kernel.shared_bytes).parameters
    ks = {s.name: s.dims["k"] for s in task.shapes("cuda")}
    too_big = []
    for shape, configs in at.items():
        for params in configs:
            c = defaults | params
            given = {"k": ks[shape], "stages": c["num_stages"]} | c
            need = kernel.shared_bytes(**{name: given[name] for name in needs})
            if need > kernel.SHARED_BYTES or not fit_an_sm(c["programs_per_sm"], need):
                too_big.append(f"{candidate} {shape} {params}: {need} bytes")
    return too_big


X_G_KERNELS = {
    "gluon_rmsnorm_gemm_rope.py": "rmsnorm_linear_rope",
    "gluon_rmsnorm_gemm_swiglu.py": "rmsnorm_linear_swiglu",
}


def test_the_gluon_plans_that_hold_a_slice_of_x_g_fit_an_sms_shared_memory() -> None:
    """The Gluon qkv and SwiGLU kernels keep their K slice's x g in shared memory beside the
    ring, so what fits depends on K: a configuration that does not fit is refused on the GPU,
    a sweep entry lost. Each of their plans' configurations fits at each of its shapes."""
    module = import_file(SCRIPTS / "bench_tasks_gpu.py")
    plans = [p for p in module.PLANS if p.candidate in X_G_KERNELS]
    assert {p.candidate for p in plans} == set(X_G_KERNELS)
    too_big = []
    for plan in plans:
        at = dict.fromkeys(plan.shapes, plan.configs)
        too_big += _gluon_configs_too_big(plan.task, plan.candidate, at)
    assert too_big == []


def test_the_gluon_x_g_kernels_gpu_test_configurations_fit_every_task_shape() -> None:
    """GLUON_X_G_EVALUATED, which the two kernels' GPU tests evaluate at every task shape, fits
    shared memory at every K of those shapes: a refusal there would fail the GPU test for a
    reason that is not a kernel bug (session 36's review found one at K 8192)."""
    too_big = []
    for candidate, task_name in X_G_KERNELS.items():
        shapes = [s.name for s in load_task(task_name).shapes("cuda")]
        at = dict.fromkeys(shapes, GLUON_X_G_EVALUATED)
        too_big += _gluon_configs_too_big(task_name, candidate, at)
    assert too_big == []


def test_the_gluon_residual_plans_fit_their_programs_into_an_sms_shared_memory() -> None:
    """Each configuration of the Gluon GEMM + residual's plans fits shared memory
    `programs_per_sm` times over (the register cap lets that many share an SM only where their
    rings fit too)."""
    module = import_file(SCRIPTS / "bench_tasks_gpu.py")
    plans = [p for p in module.PLANS if p.candidate == "gluon_gemm_residual.py"]
    assert any(c.get("programs_per_sm", 1) > 1 for p in plans for c in p.configs)
    too_big = []
    for plan in plans:
        at = dict.fromkeys(plan.shapes, plan.configs)
        too_big += _gluon_configs_too_big(plan.task, plan.candidate, at)
    assert too_big == []


SWEEP_ONE_CONFIG = """
import dataclasses, sys
from pathlib import Path
from tests.source_files import import_file
script = import_file(Path(sys.argv[1]))
plan = next(p for p in script.PLANS if p.tag == "qkv16")
plan = dataclasses.replace(plan, configs=plan.configs[:1], rivals=[])
script.sweep(plan, Path(sys.argv[2]))
"""


def test_a_sweep_needs_no_optuna(tmp_path) -> None:
    """The device image has no optuna, and a call that only sweeps carries jsonschema's wheels
    alone (.whl/gpu): a sweep must import nothing that needs optuna (loop.driver does). With
    optuna made unimportable, one configuration's sweep gets as far as the evaluator's verdict
    (here, on the CPU, a crash for want of a GPU) and writes its file."""
    shim = tmp_path / "shim"
    (shim / "optuna").mkdir(parents=True)
    (shim / "optuna" / "__init__.py").write_text('raise ImportError("no optuna here")\n')
    out = tmp_path / "out"
    out.mkdir()
    root = SCRIPTS.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(root)])}
    result = subprocess.run(
        [sys.executable, "-c", SWEEP_ONE_CONFIG, str(SCRIPTS / "bench_tasks_gpu.py"), str(out)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no optuna here" not in result.stderr
    (written,) = out.glob("sweep-*.json")
    (config,) = json.loads(written.read_text())["configs"]
    assert config["accepted"] or config["reasons"]  # the evaluator ran it (a verdict either way)
