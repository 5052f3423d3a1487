"""A realistic schema-v1 report (an H200 RMSNorm run, numbers from shared/ANCHORS.md) for tests."""

from __future__ import annotations


def timing(median_us: float, spread_pct: float = 0.2, method: str = "cuda-graph") -> dict:
    """A timing record around `median_us` microseconds with a +-`spread_pct` % interval."""
    median = median_us * 1e-6
    half = median * spread_pct / 100
    return {
        "median_s": median,
        "ci_low_s": median - half,
        "ci_high_s": median + half,
        "n_blocks": 20,
        "n_samples": 400,
        "method": method,
    }


def _rmsnorm_shape(name: str, tokens: int, hidden: int, weight: float, us: dict) -> dict:
    eager, compiled, winner, lo, hi, params = us
    return {
        "name": name,
        "shape": {"tokens": tokens, "hidden": hidden},
        "weight": weight,
        "bytes": 2 * tokens * hidden * 2 + hidden * 2,
        "flops": 4.0 * tokens * hidden,
        "peers": {"eager": timing(eager), "torch.compile": timing(compiled)},
        "incumbent": timing(compiled * 0.8) if tokens >= 32768 else None,
        "winner": {
            "candidate": "triton_rmsnorm",
            "params": params,
            "timing": {
                **timing(winner),
                "telemetry": {
                    "sm_clock_mhz": {"min": 1965, "median": 1980, "max": 1980},
                    "temperature_c": {"min": 41, "median": 43, "max": 45},
                    "power_w": {"min": 310.5, "median": 402.0, "max": 455.2},
                    "throttle_reasons": [],
                    "throttled_blocks": 0,
                },
            },
            "speedup_vs_best_peer": {
                "ratio": compiled / winner,
                "ci_low": lo,
                "ci_high": hi,
                "n_blocks": 20,
            },
        },
    }


def sample_report() -> dict:
    """A fresh, valid report dict; tests may mutate it freely."""
    return {
        "schema_version": "1",
        "created": "2026-11-29T14:03:12Z",
        "command": "autotune run --out out/h200 --tasks rmsnorm --trials 40",
        "fingerprint": {
            "git": {"commit": "3f2c1a9d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39", "dirty": False},
            "locks": {
                "uv_lock_sha256": "9b1f0c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b",
                "flake_lock_sha256": None,
            },
            "nix_store_path": None,
            "versions": {
                "autotune": "0.1.0",
                "python": "3.11.7",
                "torch": "2.11.0+cu130",
                "triton": "3.6.0",
                "cupy": None,
                "cuda_runtime": "13.0",
                "driver": "580.159.04",
                "nvml": "13.580.159.04",
            },
            "gpus": [
                {
                    "index": 0,
                    "name": "NVIDIA H200",
                    "vbios": "96.00.A5.00.1A",
                    "uuid": "redacted",
                    "serial": "redacted",
                    "pci_bus_id": "00000000:00:06.0",
                    "compute_capability": "9.0",
                    "power_limit_w": 700.0,
                    "clocks_mhz": {"sm": 345, "mem": 3201, "sm_max": 1980, "mem_max": 3201},
                }
            ],
            "host": {
                "hostname": "gpu-host-7",
                "os": "Linux (Ubuntu 24.04.3 LTS)",
                "kernel": "6.18.0",
                "machine": "x86_64",
                "cpu_model": "Intel(R) Xeon(R) Processor",
                "cpu_count": 16,
            },
            "ids_redacted": True,
        },
        "host": {
            "gpu_present": True,
            "facts": {
                "virtualization_mode": "PASSTHROUGH",
                "pcie": {"current": "Gen5 x16", "max": "Gen5 x16"},
                "thp": "madvise",
                "numa_nodes": 1,
            },
            "checks": [
                {
                    "id": "pcie.link",
                    "status": "pass",
                    "actual": "Gen5 x16",
                    "recommended": "Gen5 x16",
                    "severity": "high",
                    "fix": None,
                },
                {
                    "id": "gpu.persistence",
                    "status": "pass",
                    "actual": True,
                    "recommended": True,
                    "severity": "medium",
                    "fix": None,
                },
                {
                    "id": "cpu.governor",
                    "status": "unknown",
                    "actual": None,
                    "recommended": "performance",
                    "severity": "low",
                    "fix": "cpupower frequency-set -g performance",
                    "message": "no cpufreq in this guest",
                },
                {
                    "id": "host.virtualization",
                    "status": "warn",
                    "actual": "passthrough",
                    "recommended": "bare-metal",
                    "severity": "medium",
                    "fix": "rent a bare-metal host for the last few percent",
                },
            ],
            "note": None,
        },
        "profile": {
            "name": "h200-sxm-locked",
            "mode": "dry-run",
            "changes": [
                {"setting": "gpu.locked_clocks_mhz", "before": None, "after": [1980, 1980]},
                {"setting": "gpu.power_limit_w", "before": 700, "after": 700, "status": "planned"},
            ],
            "restored": None,
        },
        "baselines": {
            "metrics": [
                {
                    "name": "d2d_copy",
                    "unit": "TB/s",
                    "value": 4.2746,
                    "ci_low": 4.2701,
                    "ci_high": 4.2788,
                    "n": 30,
                },
                {
                    "name": "bf16_gemm_8192",
                    "unit": "TFLOP/s",
                    "value": 700.95,
                    "ci_low": 698.12,
                    "ci_high": 703.40,
                    "n": 30,
                },
                {
                    "name": "h2d_pinned",
                    "unit": "GB/s",
                    "value": 55.47,
                    "ci_low": None,
                    "ci_high": None,
                    "n": 1,
                },
            ],
            "environment": {
                "kind": "vm-passthrough",
                "evidence": ["cpuinfo: hypervisor flag", "NVML virtualization mode PASSTHROUGH"],
            },
        },
        "noise": {
            "aa_ratio_ci": [0.99933, 1.00067],
            "noise_floor": 0.00067,
            "min_effect": 0.01,
            "decisions": 200,
            "decisions_same": 200,
            "task": "rmsnorm",
            "shape": "32768x4096",
            "seconds_per_decision": 0.166,
        },
        "tasks": [
            {
                "task": "rmsnorm",
                "device": "cuda",
                "dtype": "bfloat16",
                "language_used": ["triton", "torch"],
                "trials": 40,
                "accepted": 6,
                "rejected_by_reason": {"not-faster": 27, "wrong-result": 5, "graph-capture": 2},
                "dispatch": [
                    {
                        "bucket": "tokens 1..64",
                        "shapes": ["decode-1x4096"],
                        "candidate": "torch.compile",
                        "params": {},
                        "source": "peer",
                    },
                    {
                        "bucket": "tokens 65..16384",
                        "shapes": ["4096x4096"],
                        "candidate": "triton_rmsnorm",
                        "params": {"BLOCK": 4096, "num_warps": 8},
                        "source": "candidate",
                    },
                    {
                        "bucket": "tokens > 16384, hidden 7168",
                        "shapes": ["32768x7168"],
                        "candidate": "triton_rmsnorm",
                        "params": {"BLOCK": 8192, "num_warps": 16},
                        "source": "candidate",
                    },
                    {
                        "bucket": "tokens > 16384, hidden 4096",
                        "shapes": ["131072x4096"],
                        "candidate": "triton_rmsnorm",
                        "params": {"BLOCK": 4096, "num_warps": 8},
                        "source": "candidate",
                    },
                ],
                "shapes": [
                    {
                        "name": "decode-1x4096",
                        "shape": {"tokens": 1, "hidden": 4096},
                        "weight": 0.25,
                        "bytes": 2 * 4096 * 2 + 4096 * 2,
                        "flops": 4.0 * 4096,
                        "peers": {"eager": timing(9.1), "torch.compile": timing(2.6)},
                        "incumbent": None,
                        "winner": None,
                    },
                    _rmsnorm_shape(
                        "4096x4096",
                        4096,
                        4096,
                        0.25,
                        (248.53, 23.01, 21.57, 1.062, 1.071, {"BLOCK": 4096, "num_warps": 8}),
                    ),
                    _rmsnorm_shape(
                        "32768x7168",
                        32768,
                        7168,
                        0.25,
                        (2984.83, 454.98, 227.04, 1.998, 2.011, {"BLOCK": 8192, "num_warps": 16}),
                    ),
                    _rmsnorm_shape(
                        "131072x4096",
                        131072,
                        4096,
                        0.25,
                        (6784.48, 1040.29, 520.26, 1.995, 2.004, {"BLOCK": 4096, "num_warps": 8}),
                    ),
                ],
            }
        ],
        "loop": {
            "store": "sqlite:///.autotune/store.db",
            "resumed": False,
            "stop_reason": "trials-exhausted",
            "duration_s": 412.5,
        },
        "gains": {
            "hardware": None,
            "kernel": {"ratio": 1.97, "ci_low": 1.96, "ci_high": 1.98},
            "end_to_end": None,
        },
    }
