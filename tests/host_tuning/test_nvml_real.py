"""The real NVML backend, through the installed pynvml: never raises on reads, refuses writes."""

from __future__ import annotations

import pynvml
import pytest

from host_tuning.nvml import DEVICE_FIELDS, NvmlError, NvmlPermissionError, RealNvml, probe_nvml

torch = pytest.importorskip("torch")
HAS_GPU = torch.cuda.is_available()


def test_probe_gives_a_backend_or_a_reason() -> None:
    probe = probe_nvml()
    assert (probe.backend is None) == (probe.reason is not None)
    if probe.backend is not None:
        assert probe.backend.device_count() >= 0
        probe.backend.close()


@pytest.mark.skipif(HAS_GPU, reason="needs NVML absent")
def test_without_a_driver_the_reason_says_nvml_did_not_load() -> None:
    probe = probe_nvml()
    assert probe.backend is None
    assert probe.reason.startswith("NVML did not load")


@pytest.mark.skipif(HAS_GPU, reason="another test may hold NVML initialised on a GPU host")
def test_uninitialised_library_errors_become_readings() -> None:
    # pynvml without nvmlInit: every call fails with a real NVMLError (Uninitialized).
    nvml = RealNvml(pynvml)
    reading = nvml.read(0, "name")
    assert reading.value is None and "Uninitialized" in reading.reason
    assert "Uninitialized" in nvml.read_system("driver_version").reason
    with pytest.raises(NvmlError, match="device count"):
        nvml.device_count()
    with pytest.raises(ValueError, match="bogus"):
        nvml.read(0, "bogus")


def test_writes_are_refused_by_the_real_backend() -> None:
    nvml = RealNvml(pynvml)
    with pytest.raises(NvmlPermissionError, match="read-only"):
        nvml.set_power_limit(0, 100000)
    with pytest.raises(NvmlPermissionError, match="read-only"):
        nvml.set_gpu_locked_clocks(0, 1000, 1000)


@pytest.mark.gpu
def test_real_gpu_answers_every_field_without_raising() -> None:
    probe = probe_nvml()
    assert probe.backend is not None, probe.reason
    with probe.backend as nvml:
        assert nvml.device_count() >= 1
        readings = {f: nvml.read(0, f) for f in DEVICE_FIELDS}
        assert readings["name"].ok and readings["name"].value.startswith("NVIDIA")
        assert isinstance(readings["pcie_link_gen_max"].value, int)
        for field, reading in readings.items():
            assert (reading.value is None) == (reading.reason is not None), field
        assert nvml.read_system("driver_version").ok
