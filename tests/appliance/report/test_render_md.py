"""Markdown rendering: every section of the sample report, its tables and its numbers."""

from __future__ import annotations

import re

import pytest

from appliance.report import render_markdown
from appliance.report.render_md import InvalidReport
from tests.appliance.sample_report import sample_report


def _section(md: str, title: str) -> str:
    """The text of the section whose heading line ends with `title`, up to the next heading."""
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ |\Z)", md, re.M | re.S)
    assert match, f"no section {title!r} in:\n{md}"
    return match.group(1)


def _tables(text: str) -> list[list[list[str]]]:
    """Markdown tables in `text` as rows of cells (header first, separator dropped)."""
    tables, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(set(c) <= {"-"} and c for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def _rows_by_first_cell(table: list[list[str]]) -> dict[str, dict[str, str]]:
    header, *rows = table
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows}


@pytest.fixture
def doc() -> dict:
    return sample_report()


@pytest.fixture
def md(doc: dict) -> str:
    return render_markdown(doc)


def test_every_table_row_has_as_many_cells_as_its_header(md: str) -> None:
    tables = _tables(md)
    assert len(tables) >= 8
    for table in tables:
        assert {len(row) for row in table} == {len(table[0])}, table


def test_title_and_environment_fingerprint(doc: dict, md: str) -> None:
    assert md.startswith("# autotune report\n")
    assert doc["created"] in md.splitlines()[2]
    env = _rows_by_first_cell(_tables(_section(md, "Environment"))[0])
    fp = doc["fingerprint"]
    assert env["git commit"]["value"] == fp["git"]["commit"]
    assert env["uv.lock sha256"]["value"] == fp["locks"]["uv_lock_sha256"]
    assert env["flake.lock sha256"]["value"] == "—"
    assert env["triton"]["value"] == fp["versions"]["triton"]
    assert env["NVIDIA driver"]["value"] == fp["versions"]["driver"]
    assert fp["versions"]["cuda_runtime"] in env["torch"]["value"]
    gpu = fp["gpus"][0]
    assert gpu["name"] in env["GPU 0"]["value"]
    assert gpu["vbios"] in env["GPU 0"]["value"]
    assert env["GPU ids"]["value"] == "redacted"


def test_host_checks_put_non_passing_first(doc: dict, md: str) -> None:
    checks = _tables(_section(md, "Host checks"))[0]
    statuses = [row[1] for row in checks[1:]]
    assert statuses == sorted(statuses, key=["fail", "warn", "unknown", "pass"].index)
    assert {row[0] for row in checks[1:]} == {c["id"] for c in doc["host"]["checks"]}
    governor = _rows_by_first_cell(checks)["cpu.governor"]
    assert governor["fix"] == "cpupower frequency-set -g performance"
    assert governor["actual"] == "—"


def test_baselines_show_values_with_intervals(doc: dict, md: str) -> None:
    section = _section(md, "Baselines")
    assert doc["baselines"]["environment"]["kind"] in section
    rows = _rows_by_first_cell(_tables(section)[0])
    copy = rows["d2d_copy"]
    assert copy["value"] == "4.275 TB/s"
    assert copy["interval"] == "[4.27, 4.279]"
    assert copy["n"] == "30"
    assert rows["h2d_pinned"]["interval"] == "—"


def test_noise_floor_section(doc: dict, md: str) -> None:
    rows = _rows_by_first_cell(_tables(_section(md, "Noise floor"))[0])
    lo, hi = doc["noise"]["aa_ratio_ci"]
    assert rows["A/A ratio interval"]["value"] == f"[{lo:.4f}, {hi:.4f}]"
    assert rows["noise floor"]["value"] == "0.067 %"
    assert rows["minimum effect"]["value"] == "1 %"
    assert rows["keep a candidate when its interval clears"]["value"] == "1.01x"
    assert rows["A/A decisions"]["value"].startswith(str(doc["noise"]["decisions"]))


def test_per_shape_table_has_peer_winner_params_and_speedup(doc: dict, md: str) -> None:
    task = doc["tasks"][0]
    section = _section(md, f"Task `{task['task']}` (cuda, bfloat16)")
    assert f"{task['trials']} trials, {task['accepted']} accepted" in section
    shapes = _rows_by_first_cell(_tables(_section(md, "Per shape"))[0])
    assert list(shapes) == [s["name"] for s in task["shapes"]]
    big = shapes["32768x7168"]
    winner = task["shapes"][2]["winner"]
    speedup = winner["speedup_vs_best_peer"]
    assert big["best peer"] == "torch.compile"
    assert big["peer time"] == "455 µs [454.1, 455.9]"
    assert big["winner"] == winner["candidate"]
    assert big["params"] == "BLOCK=8192, num_warps=16"
    assert big["winner time"] == "227 µs [226.6, 227.5]"
    assert big["speedup vs best peer [interval]"] == (
        f"{speedup['ratio']:.3f}x [{speedup['ci_low']:.3f}, {speedup['ci_high']:.3f}]"
    )
    assert big["size"] == "tokens=32768, hidden=7168"
    assert shapes["131072x4096"]["peer time"].startswith("1.04 ms")
    assert shapes["decode-1x4096"]["winner"] == "none accepted"
    assert shapes["decode-1x4096"]["incumbent time"] == "—"


def test_dispatch_and_rejections(doc: dict, md: str) -> None:
    task = doc["tasks"][0]
    dispatch = _tables(_section(md, "Dispatch"))[0]
    assert [row[0] for row in dispatch[1:]] == [e["bucket"] for e in task["dispatch"]]
    first = _rows_by_first_cell(dispatch)["tokens 1..64"]
    assert (first["use"], first["params"], first["source"]) == ("torch.compile", "—", "peer")
    rejected = _tables(_section(md, "Rejected proposals"))[0]
    assert rejected[1:] == [
        [code, str(n)]
        for code, n in sorted(task["rejected_by_reason"].items(), key=lambda kv: -kv[1])
    ]


def test_reproduce_command_is_in_a_code_block(doc: dict, md: str) -> None:
    assert f"```sh\n{doc['command']}\n```" in _section(md, "Reproduce")


def test_profile_loop_and_gains(doc: dict, md: str) -> None:
    profile = _section(md, "Profile")
    assert doc["profile"]["name"] in profile
    assert "dry run" in profile
    loop = _rows_by_first_cell(_tables(_section(md, "Loop"))[0])
    assert loop["store"]["value"] == doc["loop"]["store"]
    assert loop["stopped because"]["value"] == doc["loop"]["stop_reason"]
    gains = _rows_by_first_cell(_tables(_section(md, "Gains"))[0])
    assert gains["kernel"]["ratio [interval]"] == "1.970x [1.960, 1.980]"
    assert gains["end-to-end"]["ratio [interval]"] == "—"


def test_a_cpu_run_without_profile_noise_or_winners_still_renders(doc: dict) -> None:
    doc["fingerprint"]["gpus"] = []
    doc["host"]["gpu_present"] = False
    doc["host"]["note"] = "no NVIDIA driver: ran on the CPU"
    doc["profile"] = None
    doc["noise"] = None
    del doc["gains"]
    task = doc["tasks"][0]
    task["device"] = "cpu"
    for shape in task["shapes"]:
        shape["winner"] = None
        for timing in shape["peers"].values():
            timing["method"] = "host-clock"
    md = render_markdown(doc)
    assert "no GPU (CPU run)" in md.splitlines()[2]
    assert "no NVIDIA driver: ran on the CPU" in md
    assert "No tuning profile was chosen." in _section(md, "Profile")
    assert "No A/A calibration was run." in _section(md, "Noise floor")
    assert "## Gains" not in md
    assert "## Task `rmsnorm` (cpu, bfloat16)" in md


def test_pipes_and_fences_in_text_do_not_break_the_markdown(doc: dict) -> None:
    doc["host"]["checks"][0]["fix"] = "echo a | sudo tee /sys/x"
    doc["command"] = "autotune run --note '```'"
    md = render_markdown(doc)
    assert "echo a \\| sudo tee /sys/x" in md
    assert "````sh\nautotune run --note '```'\n````" in md
    for table in _tables(md):
        assert {len(row) for row in table} == {len(table[0])}


def test_an_invalid_report_is_refused_with_the_failing_paths(doc: dict) -> None:
    doc["tasks"][0]["shapes"][2]["winner"]["timing"]["median_s"] = -1
    del doc["loop"]
    with pytest.raises(InvalidReport) as caught:
        render_markdown(doc)
    paths = {e.path for e in caught.value.errors}
    assert paths == {"tasks/0/shapes/2/winner/timing/median_s", "loop"}
    assert "tasks/0/shapes/2/winner/timing/median_s" in str(caught.value)
