"""Helpers for writers of a report (the pipeline): the version 2 blocks built from what the
loop and the baselines return, so the shapes match the schema."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from appliance.report.document import proposals_from_tasks

__all__ = ["candidate_spec", "comparison_block", "proposals_from_tasks", "shape_claim"]


def candidate_spec(path: Path, params: dict, repo_root: Path | None = None) -> dict:
    """`incumbent_spec`: which candidate file (stem, path, SHA-256) ran with which params."""
    path = Path(path)
    shown = str(path)
    if repo_root is not None and path.resolve().is_relative_to(Path(repo_root).resolve()):
        shown = str(path.resolve().relative_to(Path(repo_root).resolve()))
    return {
        "candidate": path.stem,
        "params": dict(params),
        "path": shown,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def shape_claim(spec: dict, best_peer: str | None, speedup: dict | None) -> dict[str, Any]:
    """The per-shape claim fields `report verify` checks: merge them into a shape result.

    `speedup` is the incumbent's interleaved ratio against `best_peer` ({ratio, ci_low,
    ci_high[, n_blocks]}, e.g. a row of `loop.driver.final_comparison`), or None.
    """
    ratio = None
    if speedup is not None:
        ratio = {k: speedup[k] for k in ("ratio", "ci_low", "ci_high", "n_blocks") if k in speedup}
    return {
        "best_peer": best_peer,
        "incumbent_spec": spec,
        "incumbent_speedup_vs_best_peer": ratio,
    }


def comparison_block(comparison: Any, kind_a: str | None = None, kind_b: str | None = None) -> dict:
    """`baselines.comparison` from a `baselines.compare.Comparison` (or its to_dict())."""
    data = comparison.to_dict() if hasattr(comparison, "to_dict") else dict(comparison)
    block = {k: data[k] for k in ("label_a", "label_b", "metrics") if k in data}
    for key in ("summary", "lines", "notes", "min_effect"):
        if key in data:
            block[key] = data[key]
    if kind_a:
        block["kind_a"] = kind_a
    if kind_b:
        block["kind_b"] = kind_b
    return block
