# pyproject.toml's [project].dependencies, each mapped to its nixpkgs Python package.
# A dependency added to pyproject.toml without a line here stops evaluation with its name.
{
  lib,
  pyproject,
  withCuda,
}:
ps:
let
  nixpkgsFor = {
    click = ps.click;
    torch = ps.torch;
    triton = ps.triton;
    # nixpkgs builds CuPy against its own CUDA; the wheel name pins a CUDA major instead.
    cupy-cuda12x = if withCuda then ps.cupy else null;
    nvidia-ml-py = ps.nvidia-ml-py;
    psutil = ps.psutil;
    fabric = ps.fabric;
    jsonschema = ps.jsonschema;
    optuna = ps.optuna;
    rich = ps.rich;
    numpy = ps.numpy;
    # The "binary" extra is psycopg's C implementation; nixpkgs' psycopg always carries it
    # (psycopg-c, built against nixpkgs' libpq).
    psycopg = ps.psycopg;
  };
  # PEP 503 normalised name of a PEP 508 requirement: "Foo_Bar>=1; extra" -> "foo-bar".
  nameOf =
    requirement:
    let
      match = builtins.match "[[:space:]]*([A-Za-z0-9._-]+).*" requirement;
    in
    if match == null then
      throw "flake: cannot read a package name in pyproject.toml dependency '${requirement}'"
    else
      lib.toLower (builtins.replaceStrings [ "_" "." ] [ "-" "-" ] (builtins.head match));
  lookup =
    name:
    nixpkgsFor.${name}
      or (throw "flake: pyproject.toml dependency '${name}' has no nixpkgs package in nix/python-deps.nix");
in
builtins.filter (p: p != null) (map (r: lookup (nameOf r)) pyproject.project.dependencies)
