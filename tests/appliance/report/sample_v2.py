"""A realistic schema-v2 report: the v1 H200 sample, upgraded, with every v2 block filled."""

from __future__ import annotations

from appliance.report.document import upgrade
from tests.appliance.sample_report import sample_report, timing


def _telemetry_samples(n: int = 40) -> list[dict]:
    """A run that warms from 38 to 57 °C; the SM clock dips once (power cap) near the end."""
    out = []
    for i in range(n):
        capped = i == n - 5
        out.append(
            {
                "t_s": i * 10.0,
                "sm_clock_mhz": 1755 if capped else 1980,
                "mem_clock_mhz": 3201,
                "temperature_c": 38 + 19 * i / (n - 1),
                "power_w": 420.0 + (i % 7) * 20,
                "reasons": ["sw_power_cap"] if capped else [],
                "label": "loop" if i > 5 else "baselines",
            }
        )
    return out


def sample_v2() -> dict:
    """A fresh, valid v2 report dict; tests may mutate it freely."""
    doc = upgrade(sample_report())
    doc["reproduce"]["verify_command"] = "autotune report verify out/h200/report.json"
    doc["reproduce"]["env"] = {"CUDA_VISIBLE_DEVICES": "0"}
    doc["profile"] = {
        "name": "h200-sxm-locked",
        "mode": "applied",
        "changes": [
            {
                "setting": "gpu.locked_clocks_mhz",
                "before": None,
                "after": [1980, 1980],
                "read_back": [1980, 1980],
                "status": "restored",
            },
            {"setting": "gpu.power_limit_w", "before": 700, "after": 700, "status": "skipped"},
        ],
        "restored": True,
        "journal": "/run/autotune/host-journal.jsonl",
        "applied_at": "2026-11-29T14:03:20Z",
        "restored_at": "2026-11-29T14:10:12Z",
        "restore_errors": [],
    }
    doc["noise"]["ratio"] = 1.0
    doc["noise"]["samples"] = [1 + ((i * 37) % 13 - 6) * 1e-4 for i in range(200)]
    doc["noise"]["sample_unit"] = "decision"
    doc["baselines"]["comparison"] = {
        "label_a": "bare metal",
        "label_b": "passthrough VM",
        "kind_a": "bare-metal",
        "kind_b": "vm-passthrough",
        "summary": "bare metal better on 1 of 2 metrics",
        "metrics": [
            {
                "name": "launch_latency",
                "title": "launch latency",
                "unit": "us",
                "higher_is_better": False,
                "a": {"value": 2.1, "ci_low": 2.08, "ci_high": 2.12, "n": 30},
                "b": {"value": 2.48, "ci_low": 2.45, "ci_high": 2.51, "n": 30},
                "ratio": 1.18,
                "ci_low": 1.15,
                "ci_high": 1.21,
                "verdict": "A better",
            },
            {
                "name": "d2d_copy",
                "unit": "TB/s",
                "a": {"value": 4.28, "ci_low": 4.27, "ci_high": 4.29, "n": 30},
                "b": {"value": 4.27, "ci_low": 4.26, "ci_high": 4.28, "n": 30},
                "ratio": 1.002,
                "ci_low": 0.999,
                "ci_high": 1.005,
                "verdict": "same",
            },
        ],
    }
    task = doc["tasks"][0]
    task["kept"] = 3
    task["ceilings"] = {
        "bytes_per_s": 4.27e12,
        "flops_per_s": 989e12,
        "source": "measured d2d copy",
    }
    task["dispatch_file"] = "out/h200/dispatch-rmsnorm.json"
    for shape in task["shapes"]:
        shape["best_peer"] = min(shape["peers"], key=lambda p: shape["peers"][p]["median_s"])
        winner = shape["winner"]
        if winner is not None:
            winner["sha256"] = "ab" * 32
            shape["incumbent_spec"] = {
                "candidate": winner["candidate"],
                "params": dict(winner["params"]),
                "path": "kernels/rmsnorm/triton_rmsnorm.py",
                "sha256": "ab" * 32,
            }
            shape["incumbent_speedup_vs_best_peer"] = dict(winner["speedup_vs_best_peer"])
            tel = winner["timing"]["telemetry"]
            tel["samples"] = [
                {"t_s": 0.0, "sm_clock_mhz": 1980, "temperature_c": 43, "power_w": 400.0},
                {"t_s": 0.1, "sm_clock_mhz": 1965, "temperature_c": 44, "power_w": 410.0},
            ]
            tel["remeasured"] = [
                {"block": 7, "reasons": ["sw_power_cap"], "sm_clock_min_mhz": 1755}
            ]
            tel["remeasured_blocks"] = 1
    doc["gains"] = {
        "hardware": {
            "ratio": 1.031,
            "ci_low": 1.024,
            "ci_high": 1.038,
            "n_blocks": 20,
            "workload": "rmsnorm peers, all shapes",
            "baseline": "stock host",
            "tuned": "h200-sxm-locked",
        },
        "kernel": {"ratio": 1.97, "ci_low": 1.96, "ci_high": 1.98, "n_blocks": 20},
        "end_to_end": {
            "workload": "rmsnorm over the shape set, weighted",
            "tuned": {
                "kernels": "dispatch table",
                "host": "h200-sxm-locked",
                "timing": timing(250.0),
            },
            "baseline": {"kernels": "torch.compile", "host": "stock", "timing": timing(505.0)},
            "combined": {"ratio": 2.02, "ci_low": 2.0, "ci_high": 2.04, "n_blocks": 20},
            "kernel_only": {"ratio": 1.97, "ci_low": 1.96, "ci_high": 1.98, "n_blocks": 20},
            "hardware_only": {"ratio": 1.031, "ci_low": 1.024, "ci_high": 1.038, "n_blocks": 20},
            "method": "cuda-graph",
        },
    }
    doc["loop"]["proposals"]["kept"] = 3
    doc["telemetry"] = {"period_s": 10.0, "gpu_index": 0, "samples": _telemetry_samples()}
    return doc
