# The programs behind `nix run`: autotune, and the GPU smoke test, each started by
# run-with-driver.sh, which finds the host's driver first.
{
  pkgs,
  autotune,
  fingerprint,
}:
let
  inherit (pkgs) lib;
  python = pkgs.python3;
  discovery = "${autotune}/${python.sitePackages}/appliance/driver_discovery.py";
  inherit (pkgs.cudaPackages.backendStdenv) cc;

  withDriver =
    {
      name,
      program,
      programArgs ? "",
      discoveryFlags ? "",
    }:
    pkgs.writeShellApplication {
      inherit name;
      text =
        builtins.replaceStrings
          [
            "@python@"
            "@discovery@"
            "@discoveryFlags@"
            "@cc@"
            "@cxx@"
            "@flakeRev@"
            "@flakeNarHash@"
            "@nixpkgsRev@"
            "@flakeLockSha256@"
            "@uvLockSha256@"
            "@readlink@"
            "@program@"
            "@programArgs@"
          ]
          [
            (lib.getExe python)
            discovery
            discoveryFlags
            "${cc}/bin/cc"
            "${cc}/bin/c++"
            fingerprint.AUTOTUNE_NIX_FLAKE_REV
            fingerprint.AUTOTUNE_NIX_FLAKE_NARHASH
            fingerprint.AUTOTUNE_NIX_NIXPKGS_REV
            fingerprint.AUTOTUNE_NIX_FLAKE_LOCK_SHA256
            fingerprint.AUTOTUNE_NIX_UV_LOCK_SHA256
            "${pkgs.coreutils}/bin/readlink"
            program
            programArgs
          ]
          (builtins.readFile ./run-with-driver.sh);
    };

  smokePython = python.withPackages (ps: [
    ps.torch
    ps.nvidia-ml-py
  ]);
in
{
  app = withDriver {
    name = "autotune";
    program = lib.getExe autotune;
  };
  gpuSmoke = withDriver {
    name = "autotune-gpu-smoke";
    program = lib.getExe smokePython;
    programArgs = "-I ${./gpu_smoke.py}";
    discoveryFlags = "--require";
  };
}
