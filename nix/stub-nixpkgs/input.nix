# What the flake receives as its `nixpkgs` input: a source tree plus metadata.
{
  outPath = ./.;
  lib = import ./lib.nix;
  rev = "0000000000000000000000000000000000000000";
  shortRev = "0000000";
  lastModified = 0;
  narHash = "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
}
