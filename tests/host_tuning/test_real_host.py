"""Facts and checks on the real root of whatever machine runs the tests."""

from __future__ import annotations

import io
import json
import threading

import pytest
from rich.console import Console

from host_tuning.checks import NO_DRIVER, check_pcie_under_load, run_checks
from host_tuning.facts import gather_facts
from host_tuning.nvml import SimulatedNvml, probe_nvml
from host_tuning.report import host_report, render_checks_table

torch = pytest.importorskip("torch")
HAS_GPU = torch.cuda.is_available()


def test_real_root_gathers_without_crashing() -> None:
    facts = gather_facts()
    plain = json.loads(json.dumps(facts.to_dict()))
    assert plain["root"] == "/"
    assert plain["kernel"]["release"]["value"]  # /proc is always there on Linux
    results = run_checks(facts)
    assert {r.id for r in results} >= {"gpu.driver", "cpu.governor", "host.virtualization"}
    for r in results:
        assert r.status != "unknown" or r.message


@pytest.mark.skipif(HAS_GPU, reason="needs a machine without a GPU driver")
def test_without_driver_gpu_checks_say_so() -> None:
    assert probe_nvml().backend is None
    report = host_report()
    json.dumps(report)
    assert report["gpu_present"] is False
    assert NO_DRIVER in report["note"]
    driver = next(c for c in report["checks"] if c["id"] == "gpu.driver")
    assert driver["status"] in ("unknown", "fail")
    assert driver["message"].startswith(f"{NO_DRIVER}: ")
    assert not [c for c in report["checks"] if c["subject"].startswith("gpu")]


def test_table_renders_every_check() -> None:
    report = host_report()
    out = io.StringIO()
    Console(file=out, width=240, color_system=None).print(render_checks_table(report["checks"]))
    text = out.getvalue()
    for check in report["checks"]:
        assert check["id"] in text


@pytest.mark.gpu
def test_real_gpu_report_and_pcie_under_load() -> None:
    report = host_report()
    assert report["gpu_present"], report["note"]
    pcie = [c for c in report["checks"] if c["id"] in ("gpu.pcie_gen", "gpu.pcie_width")]
    assert pcie and all(c["status"] != "unknown" for c in pcie)

    stop = threading.Event()

    def load() -> None:
        a = torch.randn(4096, 4096, device="cuda")
        while not stop.is_set():
            a = (a @ a).tanh()
            torch.cuda.synchronize()

    worker = threading.Thread(target=load)
    worker.start()
    try:
        stop.wait(1.0)
        probe = probe_nvml()
        assert probe.backend is not None
        with probe.backend as nvml:
            results = check_pcie_under_load(nvml, 0)
    finally:
        stop.set()
        worker.join()
    assert [r.id for r in results] == ["gpu.pcie_gen", "gpu.pcie_width"]
    assert all(r.status in ("pass", "fail") for r in results)


def test_report_with_simulated_gpu_redacts_ids_unless_asked() -> None:
    nvml = SimulatedNvml.from_fixture("rtx4090-consumer")
    report = host_report(nvml)
    json.dumps(report)
    assert report["gpu_present"] is True
    assert report["note"].startswith("1 GPU(s) (NVIDIA GeForce RTX 4090)")
    gpu = report["facts"]["gpus"][0]["nvml"]
    assert gpu["uuid"]["value"] == "REDACTED"
    assert gpu["serial"]["value"] is None  # not supported stays unknown, not invented
    raw = host_report(nvml, redact=False)["facts"]["gpus"][0]["nvml"]
    assert raw["uuid"]["value"] == nvml.read(0, "uuid").value
