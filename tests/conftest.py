"""Test-wide settings: `gpu` tests skip where torch sees no CUDA device; a real PostgreSQL
server (`postgres_url`) for the tests of stores shared by several processes or hosts."""

from __future__ import annotations

import pytest

from tests.postgres_server import postgres_url  # noqa: F401  (a fixture)


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
