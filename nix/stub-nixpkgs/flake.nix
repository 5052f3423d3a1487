# The stand-in as a flake, so that a real `nix flake check --override-input nixpkgs ...`
# can evaluate autotune's flake against it (tests/test_flake.py). Like nixpkgs' own flake:
# `lib` as an output, `import nixpkgs { ... }` through default.nix.
{
  description = "stand-in for nixpkgs: evaluation tests only, builds nothing";
  outputs = _: { lib = import ./lib.nix; };
}
