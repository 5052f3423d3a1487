"""Fixtures of the host_tuning tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.host_tuning.fake_host import HEALTHY, LINKS, FakeTree, lay_out


@pytest.fixture
def fake_tree(tmp_path: Path) -> FakeTree:
    """fake_tree({path: text, or None to leave out}) -> root of a healthy tree so changed."""

    roots = iter(range(1_000_000))

    def make(changes: dict[str, str | None] | None = None) -> Path:
        files = {**HEALTHY, **(changes or {})}
        return lay_out(tmp_path / f"root{next(roots)}", files, LINKS)

    return make
