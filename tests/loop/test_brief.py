"""The agent's brief: ideas first, then the task, shapes with bottlenecks, the incumbent's
source, results, hardware notes for the detected generation, model notes and the rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.brief import (
    BriefInput,
    bottleneck,
    build_brief,
    generation_from_capability,
    model_family,
    read_ideas,
)
from loop.reasons import CODES
from loop.tasks import load_task

H200 = {"copy_bytes_per_s": 4.0e12, "flops_per_s": 60e12}


def test_bottleneck_from_the_roofline() -> None:
    assert bottleneck(10_000, 10_000, 5e-6, H200).kind == "launch"
    assert bottleneck(4_000_000_000, 1_000_000_000, 2e-3, H200).kind == "memory"
    assert bottleneck(1_000_000, 10**12, 0.05, H200).kind == "compute"
    detail = bottleneck(4_000_000_000, 0, 2e-3, H200).detail
    assert "50 % of the roofline" in detail
    assert bottleneck(1000, 100, 1e-5, None).kind == "memory"


def test_generations_and_model_families() -> None:
    assert generation_from_capability(8, 0) == "ampere"
    assert generation_from_capability(8, 9) == "ada"
    assert generation_from_capability(9, 0) == "hopper"
    assert generation_from_capability(10, 0) == "blackwell"
    assert generation_from_capability(7, 5) is None
    assert model_family(load_task("mla_decode")) == "deepseek"
    assert model_family(load_task("softmax")) is None


def test_ideas_from_flags_then_file(tmp_path: Path) -> None:
    f = tmp_path / "ideas.md"
    f.write_text("use TMA for the loads\n\n\nsplit K for long contexts\n")
    assert read_ideas(("pipeline the chunk loads", " "), f) == [
        "pipeline the chunk loads",
        "use TMA for the loads",
        "split K for long contexts",
    ]


@pytest.mark.parametrize("task_name", ["rmsnorm", "mla_decode"])
def test_brief_sections_in_order(task_name: str) -> None:
    task = load_task(task_name)
    source = "def kernel(*a):\n    return a[0]\n"
    shape = task.shapes("cuda")[0]
    text = build_brief(
        BriefInput(
            task=task,
            device="cuda",
            candidate_name="mine.py",
            source=source,
            params={"block": 128},
            ideas=["pipeline the chunk loads"],
            medians_s={shape.name: 4e-6},
            ceilings=H200,
            results=[
                {
                    "trial": 0,
                    "status": "keep",
                    "speedup_text": "1.200x [1.150, 1.250]",
                    "reasons": "",
                    "description": "first try",
                }
            ],
            generation="hopper",
        )
    )
    order = [
        "pipeline the chunk loads",
        "## Task",
        shape.name,
        source.strip(),
        "first try",
        "## Hardware: Hopper",
        "wgmma",
        "## Rules",
        "breaking CUDA graphs",
        "short contexts",
    ]
    positions = [text.index(s) for s in order]
    assert positions == sorted(positions)
    assert all(f"`{code}`" in text for code in CODES)
    assert ("MLA" in text) == (task_name == "mla_decode")
    row = next(line for line in text.splitlines() if line.startswith(f"| {shape.name} "))
    assert any(f"| {kind} |" in row for kind in ("launch", "memory", "compute"))


def test_brief_on_the_cpu_says_no_gpu() -> None:
    task = load_task("rmsnorm")
    text = build_brief(BriefInput(task, "cpu", "c.py", "x = 1\n", {}))
    assert "no GPU detected" in text and "(none given" in text and "(no experiments yet)" in text
