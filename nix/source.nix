# Exactly the files the wheel is built from, so that editing docs or tests rebuilds nothing.
{ lib }:
let
  fs = lib.fileset;
in
fs.toSource {
  root = ../.;
  fileset = fs.unions [
    ../pyproject.toml
    ../README.md
    ../appliance
    ../host_tuning
    ../baselines
    ../loop
    ../kernels
  ];
}
