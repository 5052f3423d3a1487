"""`autotune report compare A B`: two runs side by side (two hosts, two dates, tuned and untuned):
per task and shape the ratio of the times, the gains of each, and where the environments differ.
Pure: works on two current-version report documents, measures nothing."""

from __future__ import annotations

from typing import Any

# Fields that differ between any two runs and say nothing about comparability.
_IGNORED = {"note"}


def compare_reports(a: dict, b: dict) -> dict:
    """A JSON-ready comparison of reports `a` and `b` (both upgraded to the current version).

    Per shape, `ratio` is A's time / B's time (above 1: B is faster), with a conservative
    interval from the two time intervals (they were measured separately, not interleaved).
    """
    rows, only_a, only_b = _shape_rows(a, b)
    return {
        "a": _summary(a),
        "b": _summary(b),
        "environment": environment_changes(a, b),
        "shapes": rows,
        "only_in_a": only_a,
        "only_in_b": only_b,
        "gains": _gains(a, b),
    }


def _summary(doc: dict) -> dict:
    gpus = doc["fingerprint"]["gpus"]
    return {
        "created": doc["created"],
        "hostname": doc["fingerprint"]["host"]["hostname"],
        "gpu": gpus[0]["name"] if gpus else None,
        "profile": None if doc["profile"] is None else doc["profile"]["name"],
        "profile_mode": None if doc["profile"] is None else doc["profile"]["mode"],
        "environment": doc["baselines"]["environment"]["kind"],
        "command": doc["reproduce"]["command"],
    }


def _time_used(shape: dict) -> tuple[str, dict] | None:
    """What the run would use on this shape: the winner, else the incumbent, else the best peer."""
    if shape["winner"] is not None:
        return shape["winner"]["candidate"], shape["winner"]["timing"]
    if shape["incumbent"] is not None:
        spec = shape.get("incumbent_spec") or {}
        return spec.get("candidate", "incumbent"), shape["incumbent"]
    if shape["peers"]:
        name = min(shape["peers"], key=lambda p: shape["peers"][p]["median_s"])
        return name, shape["peers"][name]
    return None


def _shape_rows(a: dict, b: dict) -> tuple[list[dict], list[str], list[str]]:
    def index(doc: dict) -> dict[tuple[str, str], dict]:
        return {(t["task"], s["name"]): s for t in doc["tasks"] for s in t["shapes"]}

    ia, ib = index(a), index(b)
    rows = []
    for key in [k for k in ia if k in ib]:
        used_a, used_b = _time_used(ia[key]), _time_used(ib[key])
        if used_a is None or used_b is None:
            continue
        (name_a, ta), (name_b, tb) = used_a, used_b
        rows.append(
            {
                "task": key[0],
                "shape": key[1],
                "a_kernel": name_a,
                "b_kernel": name_b,
                "a_s": ta["median_s"],
                "b_s": tb["median_s"],
                "ratio": ta["median_s"] / tb["median_s"],
                "ci_low": ta["ci_low_s"] / tb["ci_high_s"] if tb["ci_high_s"] > 0 else None,
                "ci_high": ta["ci_high_s"] / tb["ci_low_s"] if tb["ci_low_s"] > 0 else None,
                "peers": _peer_ratios(ia[key]["peers"], ib[key]["peers"]),
            }
        )
    only_a = [f"{t} {s}" for t, s in ia if (t, s) not in ib]
    only_b = [f"{t} {s}" for t, s in ib if (t, s) not in ia]
    return rows, only_a, only_b


def _peer_ratios(pa: dict, pb: dict) -> dict[str, float]:
    return {
        name: pa[name]["median_s"] / pb[name]["median_s"]
        for name in pa
        if name in pb and pb[name]["median_s"] > 0
    }


def _gains(a: dict, b: dict) -> dict[str, dict]:
    out = {}
    for doc, side in ((a, "a"), (b, "b")):
        gains = doc.get("gains") or {}
        for name in ("hardware", "kernel"):
            out.setdefault(name, {})[side] = _ratio(gains.get(name))
        e2e = gains.get("end_to_end")
        out.setdefault("end_to_end", {})[side] = _ratio(e2e["combined"] if e2e else None)
    return out


def _ratio(g: dict | None) -> dict | None:
    return None if g is None else {k: g[k] for k in ("ratio", "ci_low", "ci_high")}


def environment_changes(a: dict, b: dict) -> list[dict]:
    """Every fingerprint, profile and environment field whose value differs, by JSON path."""

    def facts(doc: dict) -> dict[str, Any]:
        flat = _flatten({"fingerprint": doc["fingerprint"]})
        profile = doc["profile"] or {}
        flat["profile/name"] = profile.get("name")
        flat["profile/mode"] = profile.get("mode")
        flat["baselines/environment/kind"] = doc["baselines"]["environment"]["kind"]
        flat["host/gpu_present"] = doc["host"]["gpu_present"]
        return flat

    fa, fb = facts(a), facts(b)
    return [
        {"path": path, "a": fa.get(path), "b": fb.get(path)}
        for path in sorted(set(fa) | set(fb))
        if fa.get(path) != fb.get(path)
    ]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key not in _IGNORED:
                out.update(_flatten(item, f"{prefix}/{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        out = {}
        for i, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}/{i}"))
        return out
    return {prefix: value}
