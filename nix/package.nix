# autotune-appliance built from pyproject.toml (hatchling) with nixpkgs' Python packages.
{
  lib,
  python3Packages,
  pyprojectToml,
  src,
  withCuda,
}:
python3Packages.buildPythonApplication {
  pname = pyprojectToml.project.name;
  inherit (pyprojectToml.project) version;
  pyproject = true;
  inherit src;

  build-system = [ python3Packages.hatchling ];
  dependencies = import ./python-deps.nix {
    inherit lib withCuda;
    pyproject = pyprojectToml;
  } python3Packages;
  # nixpkgs' CuPy is the distribution "cupy", not the CUDA-12 wheel "cupy-cuda12x".
  pythonRemoveDeps = [ "cupy-cuda12x" ];

  # The test suite runs in `nix flake check` (nix/checks.nix) on the CPU package set.
  doCheck = false;
  pythonImportsCheck = [
    "appliance"
    "appliance.driver_discovery"
    "host_tuning"
    "baselines"
    "loop"
  ];

  passthru = { inherit withCuda; };

  meta = {
    inherit (pyprojectToml.project) description;
    license = lib.licenses.asl20;
    mainProgram = "autotune";
    platforms = lib.platforms.linux;
  };
}
