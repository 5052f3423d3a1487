"""The agent's brief: ideas first, then the task, shapes with bottlenecks, the incumbent's
source, results, hardware notes for the detected generation, model notes and the rules."""

from __future__ import annotations

from dataclasses import replace
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
from loop.profiler import ProfileResult, parse_ncu_csv
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
        "imports only from:",
        "no generators",
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


FIXTURE = Path(__file__).parent / "fixtures" / "ncu-rmsnorm-h200.csv"


def _profiled_brief(profiles: dict[str, ProfileResult] | None) -> str:
    task = load_task("rmsnorm")
    shape = task.shapes("cuda")[-1]
    return build_brief(
        BriefInput(
            task=task,
            device="cuda",
            candidate_name="mine.py",
            source="def kernel(*a):\n    return a[0]\n",
            params={},
            medians_s={shape.name: 3e-4},
            ceilings=H200,
            generation="hopper",
            profiles=profiles,
        )
    )


def test_brief_shows_the_profiler_counters_of_the_current_best() -> None:
    kernels = parse_ncu_csv(FIXTURE.read_text())
    shape = "long-131072x7168"
    text = _profiled_brief({shape: ProfileResult(shape, True, kernels=kernels)})
    line = next(x for x in text.splitlines() if "`_rmsnorm_rows`" in x)
    for expected in (
        "DRAM 84.7 % of peak (4.07 TB/s)",
        "L2 hit 51 %",
        "L1 hit 33 %",
        "achieved occupancy 23.8 % (theoretical 25 %)",
        "compute 44 %",
        "occupancy limited by registers (4 blocks/SM)",
        "no register spills",
        "grid 32768, block 128, 224.7 us",
    ):
        assert expected in line
    assert f"- `{shape}`: 1 kernel(s) per call" in text
    # Beside the shapes table, before the source.
    assert text.index(f"| {shape} ") < text.index("`_rmsnorm_rows`") < text.index("```python")


def test_brief_says_why_there_are_no_counters() -> None:
    reason = "ncu failed: ==ERROR== LibraryNotLoaded"
    text = _profiled_brief({"long-131072x7168": ProfileResult("long-131072x7168", False, reason)})
    assert f"- `long-131072x7168`: no profiler counters ({reason})." in text
    assert "achieved occupancy" not in text
    assert "was not profiled in this run" in _profiled_brief(None)


def test_only_the_longest_kernels_are_shown() -> None:
    [k] = parse_ncu_csv(FIXTURE.read_text())
    kernels = [replace(k, name=f"k{i}", duration_ns=float(i)) for i in range(5)]
    text = _profiled_brief({"s": ProfileResult("s", True, kernels=kernels)})
    assert "5 kernel(s) per call, the 3 longest shown" in text
    shown = [x for x in text.splitlines() if x.startswith("  - `k")]
    assert [x.split("`")[1] for x in shown] == ["k4", "k3", "k2"]
