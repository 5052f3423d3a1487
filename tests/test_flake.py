"""The Nix flake, checked as far as possible without nixpkgs: it parses, its lock pins a real
nixpkgs, Nix accepts lock and flake, and its outputs evaluate against the stand-in for nixpkgs in
nix/stub-nixpkgs, all without writing flake.lock. Also runs the `nix run` wrapper's shell body.

The Nix parts run only where `nix` is installed (CI installs Debian's nix-bin); each Nix command
uses a private store under the test's temporary folder, so no daemon or root is needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "flake.lock"
SYSTEMS = ("x86_64-linux", "aarch64-linux")
# What the flake needs to evaluate: itself, its Nix files, and the files its sources name.
FLAKE_TREE = (
    "flake.nix",
    "flake.lock",
    "uv.lock",
    "nix",
    "pyproject.toml",
    "README.md",
    "appliance",
    "host_tuning",
    "baselines",
    "loop",
    "kernels",
    "tests",
)

needs_nix = pytest.mark.skipif(
    shutil.which("nix") is None or shutil.which("nix-instantiate") is None,
    reason="nix is not installed (apt-get install -y nix-bin); the flake is checked where it is",
)


@pytest.fixture(scope="module", autouse=True)
def lock_untouched():
    """No test here may write flake.lock."""
    before = LOCK.read_bytes()
    yield
    assert LOCK.read_bytes() == before, "flake.lock was modified by the flake tests"


@pytest.fixture
def nix_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {
        **os.environ,
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "NIX_CONFIG": "experimental-features = nix-command flakes\nwarn-dirty = false",
    }


def nix(args: list[str], env: dict[str, str], cwd: Path = REPO, program: str = "nix") -> str:
    done = subprocess.run(
        [program, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{program} {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


def nix_eval(expr: str, env: dict[str, str], store: Path, self_attrs: str = "") -> object:
    """Evaluate `expr` (with `flake` = the stub-evaluated outputs) to JSON, never writing.

    `self_attrs` adds Nix attributes to the flake's `self` (`rev = "...";`), as Nix does for a
    clean or dirty git checkout.
    """
    prelude = (
        "let\n"
        "  stub = import ./nix/stub-nixpkgs/input.nix;\n"
        "  self = outputs // {\n"
        '    outPath = "/nix/store/00000000000000000000000000000000-source";\n'
        '    narHash = "sha256-0000000000000000000000000000000000000000000=";\n'
        f"    {self_attrs}\n"
        "  };\n"
        "  outputs = (import ./flake.nix).outputs { inherit self; nixpkgs = stub; };\n"
        "  flake = outputs;\n"
        "in\n"
    )
    out = nix(
        [
            "--store",
            str(store),
            "--readonly-mode",
            "--eval",
            "--strict",
            "--json",
            "--expr",
            prelude + expr,
        ],
        env,
        program="nix-instantiate",
    )
    return json.loads(out)


@pytest.fixture
def flake_copy(tmp_path: Path) -> Path:
    """The flake's files in a scratch folder, for commands that take a flake reference."""
    dest = tmp_path / "flake"
    dest.mkdir()
    for name in FLAKE_TREE:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, dest / name)
    return dest


def test_lock_pins_a_real_nixpkgs_revision() -> None:
    lock = json.loads(LOCK.read_text())
    assert lock["version"] == 7 and lock["root"] == "root"
    assert lock["nodes"]["root"]["inputs"] == {"nixpkgs": "nixpkgs"}
    node = lock["nodes"]["nixpkgs"]
    locked, original = node["locked"], node["original"]
    assert locked["type"] == "github"
    assert (locked["owner"], locked["repo"]) == ("NixOS", "nixpkgs")
    assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"])
    assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", locked["narHash"])
    assert isinstance(locked["lastModified"], int) and locked["lastModified"] > 1_700_000_000
    flake = (REPO / "flake.nix").read_text()
    url = f"github:{original['owner']}/{original['repo']}/{original['ref']}"
    assert f'inputs.nixpkgs.url = "{url}";' in flake


@needs_nix
def test_flake_parses(nix_env: dict[str, str], tmp_path: Path) -> None:
    for name in ["flake.nix", *(str(p.relative_to(REPO)) for p in (REPO / "nix").rglob("*.nix"))]:
        nix(
            ["--store", str(tmp_path / "store"), "--parse", name],
            nix_env,
            program="nix-instantiate",
        )


@needs_nix
def test_nix_accepts_the_lock_offline(
    nix_env: dict[str, str], flake_copy: Path, tmp_path: Path
) -> None:
    out = nix(
        [
            "--store",
            str(tmp_path / "store"),
            "flake",
            "metadata",
            "--offline",
            "--no-write-lock-file",
            "--json",
            f"path:{flake_copy}",
        ],
        nix_env,
    )
    locked = json.loads(out)["locks"]["nodes"]["nixpkgs"]["locked"]
    assert locked == json.loads(LOCK.read_text())["nodes"]["nixpkgs"]["locked"]
    assert (flake_copy / "flake.lock").read_bytes() == LOCK.read_bytes()


@needs_nix
def test_nix_flake_check_passes_against_the_stand_in(
    nix_env: dict[str, str], flake_copy: Path, tmp_path: Path
) -> None:
    """Nix's own output checks (apps, packages, devShells, checks, formatter), no builds."""
    nix(
        [
            "--store",
            str(tmp_path / "store"),
            "flake",
            "check",
            "--no-build",
            "--offline",
            "--no-write-lock-file",
            "--override-input",
            "nixpkgs",
            f"path:{flake_copy / 'nix/stub-nixpkgs'}",
            f"path:{flake_copy}",
        ],
        nix_env,
    )
    assert (flake_copy / "flake.lock").read_bytes() == LOCK.read_bytes()


@needs_nix
def test_outputs_evaluate_to_the_expected_attributes(
    nix_env: dict[str, str], tmp_path: Path
) -> None:
    shape = nix_eval(
        "{ packages = builtins.mapAttrs (_: builtins.attrNames) flake.packages;\n"
        "  apps = builtins.mapAttrs (_: a: builtins.mapAttrs (_: v: { inherit (v) type program; }) a) flake.apps;\n"
        "  devShells = builtins.mapAttrs (_: s: s.default.drvPath) flake.devShells;\n"
        "  checks = builtins.mapAttrs (_: c: builtins.mapAttrs (_: v: v.drvPath) c) flake.checks;\n"
        "  formatter = builtins.mapAttrs (_: f: f.drvPath) flake.formatter; }",
        nix_env,
        tmp_path / "store",
    )
    assert isinstance(shape, dict)
    for system in SYSTEMS:
        assert {"autotune", "default", "gpu-smoke", "autotune-cpu"} <= set(
            shape["packages"][system]
        )
        apps = shape["apps"][system]
        assert set(apps) == {"autotune", "default", "gpu-smoke"}
        assert all(app["type"] == "app" for app in apps.values())
        assert apps["default"] == apps["autotune"]
        assert re.fullmatch(
            r"/nix/store/[0-9a-z]{32}-autotune/bin/autotune", apps["autotune"]["program"]
        )
        assert apps["gpu-smoke"]["program"].endswith("/bin/autotune-gpu-smoke")
        assert shape["devShells"][system].endswith(".drv")
        assert set(shape["checks"][system]) == {"tests", "report-schema"}
        assert shape["formatter"][system].endswith(".drv")


@needs_nix
def test_gpu_build_uses_cuda_and_checks_use_the_cpu_set(
    nix_env: dict[str, str], tmp_path: Path
) -> None:
    facts = nix_eval(
        "let\n"
        "  p = flake.packages.x86_64-linux;\n"
        '  torchOf = pkg: builtins.head (builtins.filter (d: d.pname == "torch") pkg.dependencies);\n'
        "in {\n"
        "  gpuDeps = map (d: d.pname) p.autotune.dependencies;\n"
        "  cpuDeps = map (d: d.pname) p.autotune-cpu.dependencies;\n"
        "  gpuTorch = { inherit (torchOf p.autotune) cudaSupport cudaCapabilities; };\n"
        "  cpuTorch = (torchOf p.autotune-cpu).cudaSupport;\n"
        "  inherit (p.autotune) pname version pyproject pythonRemoveDeps;\n"
        "  buildSystem = map (d: d.pname) p.autotune.build-system;\n"
        "  mainProgram = p.autotune.meta.mainProgram;\n"
        "  defaultIsAutotune = p.default.drvPath == p.autotune.drvPath;\n"
        "  checkUsesCpuBuild = builtins.elem p.autotune-cpu.outPath\n"
        "    (map toString flake.checks.x86_64-linux.tests.nativeBuildInputs);\n"
        "}",
        nix_env,
        tmp_path / "store",
    )
    assert isinstance(facts, dict)
    declared = pyproject_dependency_names()
    assert {"torch", "triton", "cupy-cuda12x"} <= declared
    mapped = declared - {"cupy-cuda12x"}
    assert set(facts["gpuDeps"]) == mapped | {"cupy"}
    assert set(facts["cpuDeps"]) == mapped
    assert facts["gpuTorch"] == {
        "cudaSupport": True,
        "cudaCapabilities": ["8.0", "8.6", "8.9", "9.0", "10.0", "12.0"],
    }
    assert facts["cpuTorch"] is False
    assert (facts["pname"], facts["version"]) == ("autotune-appliance", "0.1.0")
    assert facts["pyproject"] is True and facts["buildSystem"] == ["hatchling"]
    assert facts["pythonRemoveDeps"] == ["cupy-cuda12x"]
    assert facts["mainProgram"] == "autotune"
    assert facts["defaultIsAutotune"] is True
    assert facts["checkUsesCpuBuild"] is True


@needs_nix
def test_unfree_nvidia_packages_are_allowed_by_name_only(
    nix_env: dict[str, str], tmp_path: Path
) -> None:
    names = ["cudnn", "libcublas", "cuda_nvcc", "cuda_cudart", "nccl", "libcusparse_lt"]
    names += ["libnvjitlink", "cutensor", "steam", "nvidia-x11", "google-chrome"]
    allowed = nix_eval(
        "let config = import ./nix/cuda-config.nix { lib = import ./nix/stub-nixpkgs/lib.nix; };\n"
        f"in builtins.listToAttrs (map (n: {{ name = n; value = config.allowUnfreePredicate "
        f'{{ pname = n; name = "${{n}}-1.0"; }}; }}) {nix_list(names)})',
        nix_env,
        tmp_path / "store",
    )
    assert isinstance(allowed, dict)
    assert {name for name, ok in allowed.items() if ok} == set(names[:8])


@needs_nix
def test_a_pyproject_dependency_without_a_nixpkgs_mapping_is_named(
    nix_env: dict[str, str], tmp_path: Path
) -> None:
    expr = (
        "let\n"
        '  pyproject = { project.dependencies = [ "torch>=2.4" "Shiny_New.Lib[extra]>=1" ]; };\n'
        '  ps = (import ./nix/stub-nixpkgs { system = "x86_64-linux"; }).python3Packages;\n'
        "  lib = import ./nix/stub-nixpkgs/lib.nix;\n"
        "in map (d: d.pname) (import ./nix/python-deps.nix { inherit lib pyproject; withCuda = false; } ps)"
    )
    store = str(tmp_path / "store")
    done = subprocess.run(
        [
            "nix-instantiate",
            "--store",
            store,
            "--readonly-mode",
            "--eval",
            "--strict",
            "--expr",
            expr,
        ],
        cwd=REPO,
        env=nix_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "'shiny-new-lib' has no nixpkgs package" in done.stderr


@needs_nix
def test_wrapper_text_finds_the_driver_before_running(
    nix_env: dict[str, str], tmp_path: Path
) -> None:
    texts = nix_eval(
        "{ app = flake.packages.x86_64-linux.autotune-with-driver.text;\n"
        "  smoke = flake.packages.x86_64-linux.gpu-smoke.text;\n"
        "  package = flake.packages.x86_64-linux.autotune.outPath; }",
        nix_env,
        tmp_path / "store",
    )
    assert isinstance(texts, dict)
    app, smoke = texts["app"], texts["smoke"]
    assert re.search(r"@[A-Za-z]+@", app + smoke) is None
    discovery = f"{texts['package']}/lib/python3.13/site-packages/appliance/driver_discovery.py"
    assert f'-I "{discovery}" --print' in app
    assert re.search(rf'exec "{re.escape(texts["package"])}/bin/autotune" +"\$@"', app)
    assert "--print --require" in smoke and "gpu_smoke.py" in smoke
    for variable, lock in (("FLAKE_LOCK", LOCK), ("UV_LOCK", REPO / "uv.lock")):
        digest = hashlib.sha256(lock.read_bytes()).hexdigest()
        assert f'export AUTOTUNE_NIX_{variable}_SHA256="{digest}"' in app
    assert 'export AUTOTUNE_NIX_FLAKE_NARHASH="sha256-000' in app
    assert 'export AUTOTUNE_NIX_NIXPKGS_REV="0000000000000000000000000000000000000000"' in app
    assert app.index("--print") < app.index("exec ")
    if shutil.which("shellcheck"):
        for name, text in (("app", app), ("smoke", smoke)):
            script = tmp_path / f"{name}.sh"
            script.write_text("#!/usr/bin/env bash\nset -o errexit -o nounset -o pipefail\n" + text)
            done = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
            assert done.returncode == 0, done.stdout


def pyproject_dependency_names() -> set[str]:
    """PEP 503 names of pyproject.toml's dependencies, as nix/python-deps.nix reads them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = (re.match(r"\s*([A-Za-z0-9._-]+)", r).group(1) for r in project["dependencies"])
    return {re.sub(r"[-_.]+", "-", name).lower() for name in names}


@needs_nix
@pytest.mark.parametrize(
    ("self_attrs", "expected"),
    [
        ("", "dirty"),
        ('rev = "' + "1" * 40 + '";', "1" * 40),
        ('dirtyRev = "' + "2" * 40 + '-dirty";', "2" * 40 + "-dirty"),
    ],
)
def test_the_wrapper_records_the_flakes_revision_or_dirty(
    nix_env: dict[str, str], tmp_path: Path, self_attrs: str, expected: str
) -> None:
    app = nix_eval(
        "flake.packages.x86_64-linux.autotune-with-driver.text",
        nix_env,
        tmp_path / "store",
        self_attrs,
    )
    assert isinstance(app, str)
    assert f'export AUTOTUNE_NIX_FLAKE_REV="{expected}"' in app


def test_binary_caches_are_documented_not_forced() -> None:
    """No live nixConfig in the flake; every cache the docs name comes with its public key."""
    flake = (REPO / "flake.nix").read_text()
    live = [line for line in flake.splitlines() if not line.lstrip().startswith("#")]
    assert not any("nixConfig" in line or "substituters" in line for line in live)
    docs = (REPO / "docs/nix.md").read_text()
    rows = [line for line in docs.splitlines() if re.match(r"\| `https://", line)]
    caches = {re.search(r"https://([^ `]+)", row).group(1): row for row in rows}
    assert {
        "cache.nixos-cuda.org",
        "cuda-maintainers.cachix.org",
        "nix-community.cachix.org",
    } <= set(caches)
    for cache, row in caches.items():
        assert re.search(r"`[a-z0-9.-]+:[A-Za-z0-9+/]{43}=`", row), f"{cache} has no public key"
        assert cache in docs[docs.index("extra-substituters =") :], (
            f"{cache} not in the nix.conf lines"
        )


def nix_list(items: list[str]) -> str:
    return "[ " + " ".join(f'"{item}"' for item in items) + " ]"


def render_wrapper(tmp_path: Path, program: Path, **overrides: str) -> Path:
    """run-with-driver.sh with this machine's paths, placed like a store entry's bin/."""
    values = {
        "@python@": sys.executable,
        "@discovery@": str(REPO / "appliance/driver_discovery.py"),
        "@discoveryFlags@": "",
        "@cc@": "/nix/store/fake-gcc-wrapper/bin/cc",
        "@cxx@": "/nix/store/fake-gcc-wrapper/bin/c++",
        "@flakeRev@": "dirty",
        "@flakeNarHash@": "sha256-flake",
        "@nixpkgsRev@": "0182a361324364ae3f436a63005877674cf45efb",
        "@flakeLockSha256@": "a" * 64,
        "@uvLockSha256@": "b" * 64,
        "@readlink@": shutil.which("readlink") or "readlink",
        "@program@": sys.executable,
        "@programArgs@": str(program),
        **overrides,
    }
    text = (REPO / "nix/run-with-driver.sh").read_text()
    for key, value in values.items():
        text = text.replace(key, value)
    assert re.search(r"@[A-Za-z]+@", text) is None
    script = tmp_path / "store-entry/bin/autotune"
    script.parent.mkdir(parents=True)
    script.write_text("#!/usr/bin/env bash\nset -o errexit -o nounset -o pipefail\n" + text)
    script.chmod(0o755)
    return script


def test_wrapper_body_runs_the_program_with_the_fingerprint(tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    from appliance.driver_discovery import find_driver_libs

    program = tmp_path / "show.py"
    program.write_text(
        "import json, os, sys\n"
        "keys = ['LD_LIBRARY_PATH', 'CC', 'CXX', 'AUTOTUNE_DRIVER_DIR']\n"
        "env = {k: v for k, v in os.environ.items() if k.startswith('AUTOTUNE_NIX_') or k in keys}\n"
        "print(json.dumps({'argv': sys.argv[1:], 'env': env}))\n"
    )
    script = render_wrapper(tmp_path, program)
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    env["LD_LIBRARY_PATH"] = "/opt/keep-me"

    done = subprocess.run(
        [str(script), "run", "--out", "dir with space", ""],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["argv"] == ["run", "--out", "dir with space", ""]
    assert seen["env"]["AUTOTUNE_NIX_FLAKE_REV"] == "dirty"
    assert seen["env"]["AUTOTUNE_NIX_FLAKE_NARHASH"] == "sha256-flake"
    assert seen["env"]["AUTOTUNE_NIX_NIXPKGS_REV"] == "0182a361324364ae3f436a63005877674cf45efb"
    assert seen["env"]["AUTOTUNE_NIX_FLAKE_LOCK_SHA256"] == "a" * 64
    assert seen["env"]["AUTOTUNE_NIX_UV_LOCK_SHA256"] == "b" * 64
    assert seen["env"]["AUTOTUNE_NIX_STORE_PATH"] == str((tmp_path / "store-entry").resolve())
    assert seen["env"]["CC"] == "/nix/store/fake-gcc-wrapper/bin/cc"
    if find_driver_libs().found:
        first, _, rest = seen["env"]["LD_LIBRARY_PATH"].partition(":")
        assert (Path(first) / "libcuda.so.1").exists() and rest == "/opt/keep-me"
        assert seen["env"]["AUTOTUNE_DRIVER_DIR"] == first
        assert "NVIDIA driver" in done.stderr
    else:
        assert seen["env"]["LD_LIBRARY_PATH"] == "/opt/keep-me"
        assert "AUTOTUNE_DRIVER_DIR" not in seen["env"]
        assert "no NVIDIA driver found" in done.stderr


def test_wrapper_body_keeps_the_users_compiler_and_stops_when_a_driver_is_required(
    tmp_path: Path,
) -> None:
    from appliance.driver_discovery import find_driver_libs

    if find_driver_libs().found:
        pytest.skip("this machine has a driver; the no-driver path cannot be shown here")
    program = tmp_path / "show.py"
    program.write_text("import os\nprint(os.environ['CC'])\n")
    env = {**os.environ, "CC": "/usr/bin/my-cc"}

    script = render_wrapper(tmp_path, program)
    kept = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert kept.returncode == 0 and kept.stdout.strip() == "/usr/bin/my-cc"

    script.unlink()
    shutil.rmtree(script.parent.parent)
    required = render_wrapper(tmp_path, program, **{"@discoveryFlags@": "--require"})
    stopped = subprocess.run([str(required)], env=env, capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 1 and stopped.stdout == ""
    assert "no NVIDIA driver found" in stopped.stderr
