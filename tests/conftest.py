"""Test-wide settings: `gpu` tests skip where torch sees no CUDA device; a real PostgreSQL
server (`postgres_url`) for the tests of stores shared by several processes or hosts; with
pytest-xdist's `-n auto`, one worker a core, or one where there is a GPU (its tests time kernels
and must not share it)."""

from __future__ import annotations

import os

import pytest

from tests.postgres_server import postgres_url  # noqa: F401  (a fixture)


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return 1 if _has_gpu() else os.cpu_count() or 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
