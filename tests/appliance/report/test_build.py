"""The helpers a report writer uses produce blocks the v2 schema accepts."""

from __future__ import annotations

import copy
import hashlib

from appliance.report import render_html, render_markdown, validate_report
from appliance.report.build import candidate_spec, comparison_block, shape_claim
from baselines.compare import compare_baselines, read_baseline
from loop.tasks import load_task
from tests.appliance.report.sample_v2 import sample_v2


def test_a_real_baseline_comparison_fits_the_schema_and_is_drawn() -> None:
    bare = read_baseline("h200-kvm-passthrough")
    other = copy.deepcopy(bare)
    for metric in other["metrics"]:
        for key in ("value", "ci_low", "ci_high"):
            metric[key] *= 0.97
    comparison = compare_baselines(bare, other, labels=("reference", "slower copy"))
    doc = sample_v2()
    doc["baselines"]["comparison"] = comparison_block(comparison, "vm-passthrough", "vm")
    assert validate_report(doc) == []
    assert len(doc["baselines"]["comparison"]["metrics"]) == len(comparison.metrics) > 0
    assert "### reference versus slower copy" in render_markdown(doc)
    html = render_html(doc)
    assert html.count('class="virt-point"') == len(comparison.metrics)


def test_candidate_spec_and_shape_claim_fit_the_schema() -> None:
    task = load_task("rmsnorm")
    path = task.folder / "torch_rmsnorm.py"
    spec = candidate_spec(path, {"method": "mean_sq"}, repo_root=task.folder.parent.parent)
    assert spec["candidate"] == "torch_rmsnorm"
    assert spec["path"] == "kernels/rmsnorm/torch_rmsnorm.py"
    assert spec["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    doc = sample_v2()
    shape = doc["tasks"][0]["shapes"][1]
    speedup = {"ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3, "rank_p": 0.01}
    shape.update(shape_claim(spec, "eager", speedup))
    assert shape["incumbent_speedup_vs_best_peer"] == {"ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3}
    assert validate_report(doc) == []
    shape.update(shape_claim(spec, "cublas", None))
    assert [e.path for e in validate_report(doc)] == ["tasks/0/shapes/1/best_peer"]
