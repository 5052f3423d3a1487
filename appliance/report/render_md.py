"""Render a report (any readable schema version, upgraded to the current one) as plain Markdown."""

from __future__ import annotations

import json
import re
from typing import Any

from appliance.report.document import InvalidReport, checked

DASH = "—"
_STATUS_ORDER = {"fail": 0, "warn": 1, "unknown": 2, "pass": 3}
# Every character that CommonMark or Python's str.splitlines (the HTML converter's) ends a line on.
_LINE_BREAKS = re.compile(r"[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+")
# Characters that open a block (heading, quote, list, rule, fence, table) at the start of a line.
_BLOCK_MARKS = tuple("#>-+*=_~`|")


__all__ = ["InvalidReport", "render_markdown"]


def render_markdown(doc: dict) -> str:
    """Markdown for a report; raises InvalidReport (naming the paths) if `doc` is not valid."""
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    doc = checked(doc)
    parts = [
        _title(doc, version),
        _environment(doc["fingerprint"]),
        _host(doc["host"]),
        _profile(doc["profile"]),
        _baselines(doc["baselines"]),
        _noise(doc["noise"]),
        _gains(doc.get("gains")),
        *(_task(task) for task in doc["tasks"]),
        _telemetry(doc.get("telemetry")),
        _loop(doc["loop"]),
        _reproduce(doc["reproduce"]),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def _title(doc: dict, version: str) -> str:
    gpus = doc["fingerprint"]["gpus"]
    where = ", ".join(_text(g["name"]) for g in gpus) if gpus else "no GPU (CPU run)"
    schema = f"Report schema v{_text(version)}"
    if version != doc["schema_version"]:
        schema += f", read as v{_text(doc['schema_version'])}"
    return f"# autotune report\n\nCreated {_text(doc['created'])} on {where}. {schema}."


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
    driver = fp.get("driver")
    if driver:
        found = f"found via {driver['source']}" if driver["found"] else "not found"
        rows.append(("driver (user space)", f"{driver['version'] or DASH}, {found}"))
        for lib in driver["libraries"]:
            rows.append((lib["soname"], f"{lib['path']} (sha256 {lib['sha256'] or DASH})"))
    nix = fp.get("nix")
    if nix:
        dirty = " (dirty)" if nix["flake_dirty"] else ""
        rows.append(("Nix flake revision", nix["flake_revision"] + dirty))
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
    note = f"\n\n{_paragraph(fp['note'])}" if fp.get("note") else ""
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
        lines.append(_paragraph(host["note"]))
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
    lines = [f"`{_text(profile['name'])}`, {mode}."]
    if profile.get("applied_at"):
        lines[0] += f" Applied at {_text(profile['applied_at'])}."
    if profile.get("restored") is not None:
        lines[0] += " Restored afterwards." if profile["restored"] else " NOT fully restored."
    if profile.get("restored_at"):
        lines[0] += f" Restored at {_text(profile['restored_at'])}."
    if profile.get("journal"):
        lines.append(f"Journal: `{_text(profile['journal'])}`.")
    if profile.get("restore_errors"):
        errors = "\n".join(f"- {_paragraph(e)}" for e in profile["restore_errors"])
        lines.append("Could not undo:\n\n" + errors)
    if not profile["changes"]:
        lines[0] += " No changes needed."
        return "## Profile\n\n" + "\n\n".join(lines)
    read_back = any("read_back" in c for c in profile["changes"])
    headers = ["setting", "before", "after", *(["read back"] if read_back else []), "status"]
    rows = [
        (
            c["setting"],
            _value(c["before"]),
            _value(c["after"]),
            *([_value(c.get("read_back"))] if read_back else []),
            c.get("status"),
        )
        for c in profile["changes"]
    ]
    lines.append(_table(headers, rows))
    return "## Profile\n\n" + "\n\n".join(lines)


def _baselines(baselines: dict) -> str:
    env = baselines["environment"]
    lines = ["## Baselines", f"Environment: {_text(env['kind'])}."]
    if env["evidence"]:
        lines[-1] += " Evidence: " + "; ".join(_text(e) for e in env["evidence"]) + "."
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
    comparison = baselines.get("comparison")
    if comparison:
        lines.append(_baseline_comparison(comparison))
    return "\n\n".join(lines)


def _baseline_comparison(c: dict) -> str:
    a, b = c["label_a"], c["label_b"]
    head = f"### {_text(a)} versus {_text(b)}"
    kinds = [_text(k) for k in (c.get("kind_a"), c.get("kind_b")) if k]
    text = [head]
    if len(kinds) == 2:
        text.append(f"{_text(a)} is {kinds[0]}, {_text(b)} is {kinds[1]}.")
    if c.get("summary"):
        text.append(_paragraph(c["summary"]))
    rows = [
        (
            m.get("title") or m["name"],
            f"{_num(m['a']['value'])} {m['unit']}".strip(),
            f"{_num(m['b']['value'])} {m['unit']}".strip(),
            _ratio(m),
            m.get("verdict"),
        )
        for m in c["metrics"]
    ]
    headers = ["metric", a, b, f"{a} better by [interval]", "verdict"]
    text.append(_table(headers, rows) if rows else "No metric was measured on both.")
    return "\n\n".join(text)


def _noise(noise: dict | None) -> str:
    if noise is None:
        return "## Noise floor\n\nNo A/A calibration was run."
    lo, hi = noise["aa_ratio_ci"]
    threshold = 1 + max(noise["min_effect"], noise["noise_floor"])
    where = ""
    if noise.get("task"):
        shape = f" {_text(noise['shape'])}" if noise.get("shape") else ""
        where = f" on {_text(noise['task'])}{shape}"
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
    samples = noise.get("samples") or []
    if samples:
        unit = noise.get("sample_unit", "decision")
        spread = f"min {min(samples):.4f}, median {_median(samples):.4f}, max {max(samples):.4f}"
        rows.append((f"A/A samples ({len(samples)}, one per {unit})", spread))
    return f"## Noise floor\n\nA/A calibration{where}.\n\n" + _table(["what", "value"], rows)


def _gains(gains: dict | None) -> str:
    if not gains:
        return ""
    parts = ["## Gains"]
    rows = [
        (name.replace("_", "-"), _ratio(g)) for name, g in gains.items() if name != "end_to_end"
    ]
    rows.append(("end-to-end", _ratio((gains.get("end_to_end") or {}).get("combined"))))
    parts.append(_table(["gain", "ratio [interval]"], rows))
    e2e = gains.get("end_to_end")
    if e2e:
        parts.append(_end_to_end(e2e))
    return "\n\n".join(parts)


def _end_to_end(e: dict) -> str:
    tuned, base = e["tuned"], e["baseline"]
    intro = (
        f"### End to end: {_text(e['workload'])}\n\n"
        f"{_text(tuned['kernels'])} on {_text(tuned['host'])} against "
        f"{_text(base['kernels'])} on {_text(base['host'])}, "
        "measured as one interleaved comparison (not a product of the ratios below)."
    )
    rows = [
        ("combined (end to end)", _ratio(e["combined"]), _blocks(e["combined"])),
        ("kernel only", _ratio(e["kernel_only"]), _blocks(e["kernel_only"])),
        ("hardware only", _ratio(e["hardware_only"]), _blocks(e["hardware_only"])),
    ]
    table = _table(["gain", "ratio [interval]", "blocks"], rows)
    times = [
        (f"{side['kernels']} on {side['host']}", _timing(side["timing"]))
        for side in (tuned, base)
        if side.get("timing")
    ]
    if times:
        table += "\n\n" + _table(["side", "time [interval]"], times)
    return f"{intro}\n\n{table}"


def _blocks(r: dict | None) -> str:
    return DASH if r is None or r.get("n_blocks") is None else str(r["n_blocks"])


def _task(task: dict) -> str:
    title = f"## Task `{_text(task['task'])}` ({_text(task['device'])}, {_text(task['dtype'])})"
    languages = ", ".join(_text(x) for x in task["language_used"]) or DASH
    kept = f", {task['kept']} kept" if task.get("kept") is not None else ""
    summary = (
        f"{task['trials']} trials, {task['accepted']} accepted{kept}. Languages tried: {languages}."
    )
    ceilings = task.get("ceilings")
    if ceilings:
        bits = []
        if ceilings["bytes_per_s"]:
            bits.append(f"{_num(ceilings['bytes_per_s'] / 1e12)} TB/s")
        if ceilings["flops_per_s"]:
            bits.append(f"{_num(ceilings['flops_per_s'] / 1e12)} TFLOP/s")
        source = f" ({_text(ceilings['source'])})" if ceilings.get("source") else ""
        summary += f" Ceilings: {', '.join(bits) or 'none measured'}{source}."
    if task.get("dispatch_file"):
        summary += f" Dispatch table file: `{_text(task['dispatch_file'])}`."
    return "\n\n".join(
        p
        for p in [
            title,
            summary,
            _shapes(task["shapes"]),
            _shape_telemetry(task["shapes"]),
            _dispatch(task["dispatch"]),
            _rejections(task["rejected_by_reason"]),
        ]
        if p
    )


def _shape_telemetry(shapes: list[dict]) -> str:
    """Telemetry of the time that counts on each shape (the winner, else the incumbent)."""
    rows = []
    for s in shapes:
        timing = s["winner"]["timing"] if s["winner"] else s["incumbent"]
        tel = (timing or {}).get("telemetry")
        if not tel:
            continue
        rows.append(
            (
                s["name"],
                _spread(tel.get("sm_clock_mhz")),
                _spread(tel.get("temperature_c")),
                _spread(tel.get("power_w")),
                ", ".join(tel.get("throttle_reasons", [])) or DASH,
                _value(tel.get("throttled_blocks")),
                _value(tel.get("remeasured_blocks", len(tel.get("remeasured", [])) or None)),
            )
        )
    if not rows:
        return ""
    headers = [
        "shape",
        "SM clock MHz",
        "temperature °C",
        "power W",
        "throttle reasons",
        "throttled blocks",
        "re-measured blocks",
    ]
    return "### Telemetry while measuring\n\n" + _table(headers, rows)


def _spread(s: dict | None) -> str:
    if not s:
        return DASH
    return f"{_num(s['median'])} [{_num(s['min'])}, {_num(s['max'])}]"


def _shapes(shapes: list[dict]) -> str:
    if not shapes:
        return "### Per shape\n\nNo shapes were measured."
    with_incumbent = any(s["incumbent"] is not None for s in shapes)
    headers = ["shape", "size", "best peer", "peer time"]
    if with_incumbent:
        headers.append("incumbent time")
    headers += ["winner", "params", "winner time", "speedup vs best peer [interval]"]
    with_claim = any(s.get("incumbent_speedup_vs_best_peer") for s in shapes)
    if with_claim:
        headers.append("incumbent vs best peer [interval]")
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
        if with_claim:
            row.append(_ratio(s.get("incumbent_speedup_vs_best_peer")))
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
    parts = ["## Loop", _table(["what", "value"], rows)]
    p = loop.get("proposals")
    if p:
        figures = [("tried", p["tried"]), ("accepted (correct, measured)", p["accepted"])]
        if p.get("kept") is not None:
            figures.append(("kept (faster than the incumbent)", p["kept"]))
        figures.append(("rejected", p["rejected"]))
        figures += [
            (f"rejected: {code}", n)
            for code, n in sorted(p["rejected_by_reason"].items(), key=lambda kv: (-kv[1], kv[0]))
        ]
        parts += ["### Proposals (honesty figures)", _table(["proposals", "count"], figures)]
    return "\n\n".join(parts)


def _telemetry(series: dict | None) -> str:
    if not series or not series["samples"]:
        return ""
    samples = series["samples"]
    span = max(x["t_s"] for x in samples) - min(x["t_s"] for x in samples)
    rows = []
    for key, label in (
        ("sm_clock_mhz", "SM clock MHz"),
        ("mem_clock_mhz", "memory clock MHz"),
        ("temperature_c", "temperature °C"),
        ("power_w", "power W"),
    ):
        values = [x[key] for x in samples if x.get(key) is not None]
        if values:
            rows.append((label, _num(min(values)), _num(_median(values)), _num(max(values))))
    reasons = sorted({r for x in samples for r in x.get("reasons", [])})
    text = f"## GPU telemetry over the run\n\n{len(samples)} samples over {_num(span)} s."
    if reasons:
        text += " Clock event reasons seen: " + ", ".join(_text(r) for r in reasons) + "."
    if rows:
        text += "\n\n" + _table(["what", "min", "median", "max"], rows)
    return text


def _reproduce(reproduce: dict) -> str:
    parts = ["## Reproduce", _code(reproduce["command"])]
    if reproduce.get("working_dir"):
        parts.insert(1, f"From `{_text(reproduce['working_dir'])}`:")
    if reproduce.get("env"):
        rows = sorted(reproduce["env"].items())
        parts.append("With the environment:\n\n" + _table(["variable", "value"], rows))
    if reproduce.get("verify_command"):
        parts += ["Check this report's claims on another host:", _code(reproduce["verify_command"])]
    return "\n\n".join(parts)


def _code(command: str) -> str:
    fence = "```"
    while fence in command:
        fence += "`"
    return f"{fence}sh\n{command}\n{fence}"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


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


def _text(value: Any) -> str:
    """`value` as Markdown text on one line that shows as written: no HTML, no new block.

    Newlines become a space; backslashes, `&` and `<` are escaped (CommonMark reads `&lt;` as
    text), so a string from the report opens no tag, comment, heading or table. Every raw HTML
    construct starts with `<`, so `>` stays readable ("tokens > 16384").
    """
    one_line = _LINE_BREAKS.sub(" ", str(value))
    return one_line.replace("\\", "\\\\").replace("&", "&amp;").replace("<", "&lt;")


def _paragraph(value: Any) -> str:
    """`_text` for a string that starts a line: a leading block marker is escaped as well."""
    text = _text(value).strip()
    if text.startswith(_BLOCK_MARKS):
        return "\\" + text
    return re.sub(r"^(\d{1,9})([.)])", r"\1\\\2", text)  # "1." would start a list


def _cell(value: Any) -> str:
    text = DASH if value is None or value == "" else _text(value)
    return text.replace("|", "\\|")


def _table(headers: list[str], rows: list) -> str:
    lines = [
        "| " + " | ".join(_cell(h) for h in headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
