# `nix flake check`: CPU only, on the CPU package set (free packages, which Hydra builds for
# cache.nixos.org).
{
  pkgs,
  autotune,
  python,
  src,
}:
{
  # The test suite without a GPU.
  tests =
    pkgs.runCommand "autotune-tests-cpu"
      {
        nativeBuildInputs = [
          python
          autotune
          pkgs.git
        ];
      }
      ''
        cp -r ${src} source
        chmod -R u+w source
        cd source
        export HOME="$TMPDIR"
        python -m pytest -m "not gpu" -p no:cacheprovider -q tests
        touch "$out"
      '';

  # The sample report the tests use validates against the schema shipped in the package.
  report-schema =
    pkgs.runCommand "autotune-report-schema"
      {
        nativeBuildInputs = [
          python
          autotune
        ];
      }
      ''
        export HOME="$TMPDIR"
        python -I -B -c '
        import json, sys
        sys.path.insert(0, sys.argv[1])
        from sample_report import sample_report
        with open(sys.argv[2], "w") as f:
            json.dump(sample_report(), f)
        ' ${src}/tests/appliance "$TMPDIR/report.json"
        autotune report validate "$TMPDIR/report.json"
        touch "$out"
      '';
}
