"""The shipped source bundle: the same files give the same bytes and hash, any change in a
shipped file changes the hash, caches and unshipped files are left out."""

from __future__ import annotations

import io
import shutil
import tarfile

import pytest

from appliance.fleet.bundle import BundleError, build_bundle, default_source, shipped_files


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "src"
    for rel in shipped_files(default_source()):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(default_source() / rel, root / rel)
    return root


def test_bundle_is_reproducible_and_tracks_content(checkout):
    first, second = build_bundle(checkout), build_bundle(checkout)
    assert first.data == second.data and first.sha256 == second.sha256

    (checkout / "appliance" / "__pycache__").mkdir(exist_ok=True)
    (checkout / "appliance" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (checkout / "tests").mkdir()
    (checkout / "tests" / "t.py").write_text("")
    assert build_bundle(checkout).sha256 == first.sha256

    cli = checkout / "appliance" / "cli.py"
    cli.write_text(cli.read_text() + "\n# edited\n")
    assert build_bundle(checkout).sha256 != first.sha256


def test_bundle_holds_the_build_inputs(checkout):
    bundle = build_bundle(checkout)
    with tarfile.open(fileobj=io.BytesIO(bundle.data)) as tar:
        names = tar.getnames()
        assert all(m.mtime == 0 and m.uid == 0 for m in tar.getmembers())
    assert {"pyproject.toml", "uv.lock", "appliance/cli.py"} <= set(names)
    assert any(n.startswith("kernels/") for n in names)
    assert not any("__pycache__" in n for n in names)


def test_not_a_checkout(tmp_path):
    with pytest.raises(BundleError, match="not an autotune checkout"):
        build_bundle(tmp_path)
