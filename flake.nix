{
  description = "autotune: a pinned GPU benchmarking appliance for rented bare metal";

  # Binary caches are documented, not forced (docs/nix.md). To use them without editing
  # nix.conf, uncomment this block and answer "y" when Nix asks (or pass --accept-flake-config).
  # nixConfig = {
  #   extra-substituters = [
  #     "https://cache.nixos-cuda.org"
  #     "https://nix-community.cachix.org"
  #   ];
  #   extra-trusted-public-keys = [
  #     "cache.nixos-cuda.org:74DUi4Ye579gUqzH4ziL9IyiJBlDpMRn9MBN8oNan9M="
  #     "nix-community.cachix.org-1:mB9FSh9qf2dCimDSUo8Zy7bkq5CX+/rkCWyvRCYg3Fs="
  #   ];
  # };

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = lib.genAttrs systems;

      cudaConfig = import ./nix/cuda-config.nix { inherit lib; };

      # The GPU package set: CUDA torch, triton, cupy. Unfree NVIDIA packages allowed by name.
      pkgsFor =
        system:
        import nixpkgs {
          inherit system;
          config = cudaConfig;
        };
      # The CPU package set (free packages only, which Hydra builds for cache.nixos.org): checks.
      cpuPkgsFor = system: import nixpkgs { inherit system; };

      pyprojectToml = builtins.fromTOML (builtins.readFile ./pyproject.toml);
      pythonDeps =
        withCuda:
        import ./nix/python-deps.nix {
          inherit lib withCuda;
          pyproject = pyprojectToml;
        };

      autotuneFor =
        pkgs: withCuda:
        import ./nix/package.nix {
          inherit lib pyprojectToml withCuda;
          inherit (pkgs) python3Packages;
          src = import ./nix/source.nix { inherit lib; };
        };

      # What a report needs to say which build produced it (appliance/fingerprint.py reads these
      # from the wrapper's environment). The lock hashes are computed here because a Nix run has
      # no checkout to hash them from.
      fingerprint = {
        AUTOTUNE_NIX_FLAKE_REV = self.rev or self.dirtyRev or "dirty";
        AUTOTUNE_NIX_FLAKE_NARHASH = self.narHash or "unknown";
        AUTOTUNE_NIX_NIXPKGS_REV = nixpkgs.rev or "unknown";
        AUTOTUNE_NIX_FLAKE_LOCK_SHA256 = builtins.hashFile "sha256" ./flake.lock;
        AUTOTUNE_NIX_UV_LOCK_SHA256 = builtins.hashFile "sha256" ./uv.lock;
      };

      wrapperFor =
        pkgs: autotune:
        import ./nix/wrapper.nix {
          inherit pkgs autotune fingerprint;
        };
    in
    {
      packages = forAllSystems (
        system:
        let
          pkgs = pkgsFor system;
          autotune = autotuneFor pkgs true;
          wrapped = wrapperFor pkgs autotune;
        in
        {
          inherit autotune;
          default = autotune;
          autotune-cpu = autotuneFor (cpuPkgsFor system) false;
          autotune-with-driver = wrapped.app;
          gpu-smoke = wrapped.gpuSmoke;
        }
      );

      apps = forAllSystems (
        system:
        let
          packages = self.packages.${system};
          app = drv: description: {
            type = "app";
            program = lib.getExe drv;
            meta.description = description;
          };
        in
        rec {
          autotune = app packages.autotune-with-driver "Find the host driver, run autotune";
          default = autotune;
          gpu-smoke = app packages.gpu-smoke "Find the host driver, NVML and a CUDA matmul";
        }
      );

      devShells = forAllSystems (
        system:
        let
          pkgs = pkgsFor system;
          python = pkgs.python3.withPackages (
            ps:
            pythonDeps true ps
            ++ [
              ps.hatchling
              ps.pytest
            ]
          );
        in
        {
          default = pkgs.mkShell {
            packages = [
              python
              pkgs.ruff
              pkgs.uv
              pkgs.git
            ];
            env = {
              # uv must use the shell's Python and packages, not download its own.
              UV_PYTHON = lib.getExe python;
              UV_PYTHON_DOWNLOADS = "never";
            };
            # GPU tests in the shell need the host's driver, exposed as `nix run` does it.
            shellHook = ''
              if driver_dir="$(${lib.getExe pkgs.python3} -I ${./appliance/driver_discovery.py} --print)" \
                && [ -n "$driver_dir" ]; then
                export LD_LIBRARY_PATH="$driver_dir''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
              fi
            '';
          };
        }
      );

      checks = forAllSystems (
        system:
        let
          pkgs = cpuPkgsFor system;
        in
        import ./nix/checks.nix {
          inherit pkgs;
          autotune = self.packages.${system}.autotune-cpu;
          python = pkgs.python3.withPackages (ps: pythonDeps false ps ++ [ ps.pytest ]);
          src = self;
        }
      );

      formatter = forAllSystems (system: (cpuPkgsFor system).nixfmt-tree);
    };
}
