"""Render a validated report document as plain, readable Markdown."""

from __future__ import annotations

import json
from typing import Any

from appliance.report.schema import ReportError, validate_report

DASH = "—"
_STATUS_ORDER = {"fail": 0, "warn": 1, "unknown": 2, "pass": 3}


class InvalidReport(ValueError):
    """The document does not follow its schema; `errors` says where."""

    def __init__(self, errors: list[ReportError]) -> None:
        self.errors = errors
        lines = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"report is not valid ({len(errors)} errors):\n{lines}")


def render_markdown(doc: dict) -> str:
    """Markdown for a report; raises InvalidReport (naming the paths) if `doc` is not valid."""
    errors = validate_report(doc)
    if errors:
        raise InvalidReport(errors)
    parts = [
        _title(doc),
        _environment(doc["fingerprint"]),
        _host(doc["host"]),
        _profile(doc["profile"]),
        _baselines(doc["baselines"]),
        _noise(doc["noise"]),
        _gains(doc.get("gains")),
        *(_task(task) for task in doc["tasks"]),
        _loop(doc["loop"]),
        _reproduce(doc["command"]),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def _title(doc: dict) -> str:
    gpus = doc["fingerprint"]["gpus"]
    where = ", ".join(g["name"] for g in gpus) if gpus else "no GPU (CPU run)"
    return (
        "# autotune report\n\n"
        f"Created {doc['created']} on {where}. Report schema v{doc['schema_version']}."
    )


def _environment(fp: dict) -> str:
    git = fp["git"]
    commit = git["commit"]
    if git["dirty"]:
        commit += " (uncommitted changes)"
    versions = fp["versions"]
    torch = versions["torch"]
    if torch and versions["cuda_runtime"]:
        torch += f" (CUDA {versions['cuda_runtime']})"
    rows = [
        ("git commit", commit),
        ("uv.lock sha256", fp["locks"]["uv_lock_sha256"]),
        ("flake.lock sha256", fp["locks"]["flake_lock_sha256"]),
        ("Nix store path", fp["nix_store_path"]),
        ("autotune", versions["autotune"]),
        ("Python", versions["python"]),
        ("torch", torch),
        ("triton", versions["triton"]),
        ("cupy", versions["cupy"]),
        ("NVIDIA driver", versions["driver"]),
    ]
    library = fp.get("driver_library")
    if library:
        rows.append(("driver library", f"{library['path']} (sha256 {library['sha256']})"))
    for gpu in fp["gpus"]:
        rows.append((f"GPU {gpu['index']}", _gpu_line(gpu)))
    host = fp["host"]
    rows += [
        ("hostname", host["hostname"]),
        ("OS / kernel", f"{host['os']} / {host['kernel']} ({host['machine']})"),
        ("CPU", _cpu_line(host)),
        ("GPU ids", "redacted" if fp["ids_redacted"] else "kept"),
    ]
    table = _table(["what", "value"], rows)
    note = f"\n\n{fp['note']}" if fp.get("note") else ""
    return f"## Environment\n\n{table}{note}"


def _gpu_line(gpu: dict) -> str:
    bits = [gpu["name"]]
    if gpu["vbios"]:
        bits.append(f"VBIOS {gpu['vbios']}")
    if gpu.get("compute_capability"):
        bits.append(f"sm {gpu['compute_capability']}")
    if gpu.get("power_limit_w") is not None:
        bits.append(f"power limit {_num(gpu['power_limit_w'])} W")
    clocks = gpu.get("clocks_mhz") or {}
    if clocks.get("sm_max") is not None:
        bits.append(f"SM clock max {clocks['sm_max']} MHz")
    if gpu.get("pci_bus_id"):
        bits.append(f"PCI {gpu['pci_bus_id']}")
    return ", ".join(bits)


def _cpu_line(host: dict) -> str:
    model = host["cpu_model"] or "unknown"
    count = host.get("cpu_count")
    return f"{model}, {count} CPUs" if count else model


def _host(host: dict) -> str:
    lines = ["## Host checks"]
    lines.append("GPU present." if host["gpu_present"] else "No GPU present: ran on the CPU.")
    if host["note"]:
        lines.append(host["note"])
    checks = sorted(host["checks"], key=lambda c: _STATUS_ORDER[c["status"]])
    if checks:
        rows = [
            (
                c["id"],
                c["status"],
                _value(c["actual"]),
                _value(c["recommended"]),
                c["severity"],
                c["fix"] or c.get("message"),
            )
            for c in checks
        ]
        headers = ["check", "status", "actual", "recommended", "severity", "fix"]
        lines.append(_table(headers, rows))
    else:
        lines.append("No checks ran.")
    if host["facts"]:
        rows = [(key, _value(value)) for key, value in sorted(host["facts"].items())]
        lines.append("### Host facts\n\n" + _table(["fact", "value"], rows))
    return "\n\n".join(lines)


def _profile(profile: dict | None) -> str:
    if profile is None:
        return "## Profile\n\nNo tuning profile was chosen."
    mode = "planned only (dry run)" if profile["mode"] == "dry-run" else "applied"
    head = f"## Profile\n\n`{profile['name']}`, {mode}."
    if profile.get("restored") is not None:
        head += " Restored afterwards." if profile["restored"] else " NOT fully restored."
    if not profile["changes"]:
        return head + " No changes needed."
    rows = [
        (c["setting"], _value(c["before"]), _value(c["after"]), c.get("status"))
        for c in profile["changes"]
    ]
    return head + "\n\n" + _table(["setting", "before", "after", "status"], rows)


def _baselines(baselines: dict) -> str:
    env = baselines["environment"]
    lines = ["## Baselines", f"Environment: {env['kind']}."]
    if env["evidence"]:
        lines[-1] += " Evidence: " + "; ".join(env["evidence"]) + "."
    if baselines["metrics"]:
        rows = [
            (
                m["name"],
                f"{_num(m['value'])} {m['unit']}".strip(),
                _interval(m["ci_low"], m["ci_high"]),
                m["n"],
            )
            for m in baselines["metrics"]
        ]
        lines.append(_table(["metric", "value", "interval", "n"], rows))
    else:
        lines.append("No baseline metrics were measured.")
    return "\n\n".join(lines)


def _noise(noise: dict | None) -> str:
    if noise is None:
        return "## Noise floor\n\nNo A/A calibration was run."
    lo, hi = noise["aa_ratio_ci"]
    threshold = 1 + max(noise["min_effect"], noise["noise_floor"])
    where = ""
    if noise.get("task"):
        where = f" on {noise['task']}" + (f" {noise['shape']}" if noise.get("shape") else "")
    same = ""
    if noise.get("decisions_same") is not None:
        same = f', {noise["decisions_same"]} of them "same"'
    rows = [
        ("A/A ratio interval", f"[{lo:.4f}, {hi:.4f}]"),
        ("noise floor", _pct(noise["noise_floor"])),
        ("minimum effect", _pct(noise["min_effect"])),
        ("keep a candidate when its interval clears", f"{threshold:.4g}x"),
        ("A/A decisions", f"{noise['decisions']}{same}"),
    ]
    return f"## Noise floor\n\nA/A calibration{where}.\n\n" + _table(["what", "value"], rows)


def _gains(gains: dict | None) -> str:
    if not gains:
        return ""
    rows = [(name.replace("_", "-"), _ratio(g)) for name, g in gains.items()]
    return "## Gains\n\n" + _table(["gain", "ratio [interval]"], rows)


def _task(task: dict) -> str:
    title = f"## Task `{task['task']}` ({task['device']}, {task['dtype']})"
    languages = ", ".join(task["language_used"]) or DASH
    summary = f"{task['trials']} trials, {task['accepted']} accepted. Languages tried: {languages}."
    return "\n\n".join(
        [
            title,
            summary,
            _shapes(task["shapes"]),
            _dispatch(task["dispatch"]),
            _rejections(task["rejected_by_reason"]),
        ]
    )


def _shapes(shapes: list[dict]) -> str:
    if not shapes:
        return "### Per shape\n\nNo shapes were measured."
    with_incumbent = any(s["incumbent"] is not None for s in shapes)
    headers = ["shape", "size", "best peer", "peer time"]
    if with_incumbent:
        headers.append("incumbent time")
    headers += ["winner", "params", "winner time", "speedup vs best peer [interval]"]
    rows = []
    for s in shapes:
        peer = _best_peer(s["peers"])
        row = [
            s["name"],
            _params(s["shape"]),
            peer[0] if peer else DASH,
            _timing(peer[1]) if peer else DASH,
        ]
        if with_incumbent:
            row.append(_timing(s["incumbent"]) if s["incumbent"] else DASH)
        winner = s["winner"]
        if winner is None:
            row += ["none accepted", DASH, DASH, DASH]
        else:
            row += [
                winner["candidate"],
                _params(winner["params"]),
                _timing(winner["timing"]),
                _ratio(winner["speedup_vs_best_peer"]),
            ]
        rows.append(row)
    return "### Per shape\n\n" + _table(headers, rows)


def _dispatch(entries: list[dict]) -> str:
    if not entries:
        return "### Dispatch\n\nNo dispatch table."
    rows = [
        (
            e["bucket"],
            ", ".join(e.get("shapes", [])),
            e["candidate"],
            _params(e["params"]),
            e["source"],
        )
        for e in entries
    ]
    return "### Dispatch\n\n" + _table(["bucket", "shapes", "use", "params", "source"], rows)


def _rejections(by_reason: dict[str, int]) -> str:
    if not by_reason:
        return "### Rejected proposals\n\nNone."
    rows = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return "### Rejected proposals\n\n" + _table(["reason", "count"], rows)


def _loop(loop: dict) -> str:
    rows = [
        ("store", loop["store"]),
        ("resumed", "yes" if loop["resumed"] else "no"),
        ("stopped because", loop["stop_reason"]),
    ]
    if loop.get("duration_s") is not None:
        rows.append(("duration", f"{_num(loop['duration_s'])} s"))
    return "## Loop\n\n" + _table(["what", "value"], rows)


def _reproduce(command: str) -> str:
    fence = "```"
    while fence in command:
        fence += "`"
    return f"## Reproduce\n\n{fence}sh\n{command}\n{fence}"


def _best_peer(peers: dict[str, dict]) -> tuple[str, dict] | None:
    if not peers:
        return None
    return min(peers.items(), key=lambda kv: kv[1]["median_s"])


def _timing(t: dict) -> str:
    """Median and interval in one unit chosen by the median, e.g. `227 µs [226.6, 227.5]`."""
    scale, unit = _time_unit(t["median_s"])
    mid, lo, hi = (_num(t[k] / scale) for k in ("median_s", "ci_low_s", "ci_high_s"))
    return f"{mid} {unit} [{lo}, {hi}]"


def _time_unit(seconds: float) -> tuple[float, str]:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if seconds >= scale:
            return scale, unit
    return 1e-9, "ns"


def _ratio(r: dict | None) -> str:
    if r is None:
        return DASH
    return f"{r['ratio']:.3f}x [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"


def _interval(lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return DASH
    return f"[{_num(lo)}, {_num(hi)}]"


def _pct(fraction: float) -> str:
    return f"{_num(fraction * 100)} %"


def _num(value: float) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{value:.4g}"


def _params(params: dict) -> str:
    if not params:
        return DASH
    return ", ".join(f"{k}={_value(v)}" for k, v in params.items())


def _value(value: Any) -> str:
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return _num(value)
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(", ", ": "))


def _cell(value: Any) -> str:
    text = DASH if value is None or value == "" else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list) -> str:
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
