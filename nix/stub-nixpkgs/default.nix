# `import nixpkgs { system; config; }` for evaluation tests: derivations that build nothing.
{
  system,
  config ? { },
  overlays ? [ ],
}:
let
  lib = import ./lib.nix;
  cudaSupport = config.cudaSupport or false;

  # The NVIDIA redistributables that CUDA torch and cupy depend on in nixpkgs, by package name.
  cudaUnfree = [
    "cuda_cccl"
    "cuda_cudart"
    "cuda_cupti"
    "cuda_nvcc"
    "cuda_nvml_dev"
    "cuda_nvrtc"
    "cuda_nvtx"
    "cuda_profiler_api"
    "cuda_cuobjdump"
    "cuda_nvdisasm"
    "libcublas"
    "libcufft"
    "libcufile"
    "libcurand"
    "libcusolver"
    "libcusparse"
    "libcusparse_lt"
    "libnvjitlink"
    "cudnn"
    "cutensor"
  ];
  allowed =
    name:
    (config.allowUnfree or false)
    || (config.allowUnfreePredicate or (_: false)) {
      pname = name;
      name = "${name}-1.0";
    };
  refuseUnfree =
    names: value:
    let
      refused = builtins.filter (n: !allowed n) names;
    in
    if refused == [ ] then
      value
    else
      throw "Package ‘${builtins.head refused}’ has an unfree license, refusing to evaluate (stub nixpkgs).";

  drv =
    name: env: extra:
    let
      d = builtins.derivation (
        {
          inherit name system;
          builder = "/bin/sh";
          args = [
            "-c"
            "echo stub > $out"
          ];
        }
        // env
      );
    in
    d // extra;

  pyPkg =
    pname: extra:
    drv "python3.13-${pname}-1.0" { } (
      {
        inherit pname;
        version = "1.0";
      }
      // extra
    );

  cudaPyPkg =
    pname:
    refuseUnfree (if cudaSupport then cudaUnfree else [ ]) (pyPkg pname {
      inherit cudaSupport;
      cudaCapabilities = config.cudaCapabilities or [ ];
    });

  python3Packages = {
    python = python3;
    hatchling = pyPkg "hatchling" { };
    pytest = pyPkg "pytest" { };
    torch = cudaPyPkg "torch";
    triton = pyPkg "triton" { };
    cupy =
      if cudaSupport then cudaPyPkg "cupy" else throw "stub nixpkgs: cupy needs config.cudaSupport";
    nvidia-ml-py = pyPkg "nvidia-ml-py" { };
    psutil = pyPkg "psutil" { };
    fabric = pyPkg "fabric" { };
    jsonschema = pyPkg "jsonschema" { };
    optuna = pyPkg "optuna" { };
    rich = pyPkg "rich" { };
    click = pyPkg "click" { };
    numpy = pyPkg "numpy" { };
    psycopg = pyPkg "psycopg" { };

    buildPythonApplication =
      args:
      assert args ? pname && args ? version && args ? src;
      assert builtins.isList (args.dependencies or [ ]);
      drv "${args.pname}-${args.version}" {
        inherit (args) src;
        dependencies = args.dependencies or [ ];
        build_system = args.build-system or [ ];
      } (builtins.removeAttrs args [ "src" ] // args.passthru or { });
  };

  python3 =
    drv "python3-3.13.0" { }
      {
        sitePackages = "lib/python3.13/site-packages";
        pkgs = python3Packages;
        meta.mainProgram = "python3";
        withPackages =
          f:
          let
            packages = f python3Packages;
          in
          drv "python3-3.13.0-env" { inherit packages; } {
            inherit packages;
            meta.mainProgram = "python3";
          };
      };

  tool = name: drv name { } { meta.mainProgram = name; };
in
assert builtins.isList overlays;
{
  inherit
    lib
    config
    system
    python3
    python3Packages
    ;
  coreutils = tool "coreutils";
  git = tool "git";
  ruff = tool "ruff";
  uv = tool "uv";
  nixfmt-tree = tool "treefmt";
  cudaPackages.backendStdenv.cc =
    refuseUnfree (if cudaSupport then [ "cuda_nvcc" ] else [ ]) (tool "gcc-wrapper");

  writeShellApplication =
    {
      name,
      text,
      runtimeInputs ? [ ],
      ...
    }:
    drv name { inherit text runtimeInputs; } {
      inherit text;
      meta.mainProgram = name;
    };

  runCommand =
    name: env: buildCommand:
    drv name (env // { inherit buildCommand; }) { inherit buildCommand; };

  mkShell =
    args:
    drv (args.name or "nix-shell") {
      packages = args.packages or [ ];
      shellHook = args.shellHook or "";
    } args;
}
