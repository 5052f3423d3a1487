# Body of the `nix run` wrappers; nix/wrapper.nix fills in the @...@ paths and
# writeShellApplication adds the shebang and `set -o errexit -o nounset -o pipefail`.
# Find the host's NVIDIA driver, expose only its libraries, record which build this is,
# then run the program. The search itself lives in appliance/driver_discovery.py.

driver_dir="$("@python@" -I "@discovery@" --print @discoveryFlags@)"
if [ -n "$driver_dir" ]; then
  export LD_LIBRARY_PATH="$driver_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export AUTOTUNE_DRIVER_DIR="$driver_dir"
fi

# Triton and torch.compile compile small C launchers at run time: give them the
# toolchain CUDA was built with unless the user chose one.
export CC="${CC:-@cc@}"
export CXX="${CXX:-@cxx@}"

# Which build this is, for the report's environment fingerprint.
export AUTOTUNE_NIX_FLAKE_REV="@flakeRev@"
export AUTOTUNE_NIX_FLAKE_NARHASH="@flakeNarHash@"
export AUTOTUNE_NIX_NIXPKGS_REV="@nixpkgsRev@"
export AUTOTUNE_NIX_FLAKE_LOCK_SHA256="@flakeLockSha256@"
export AUTOTUNE_NIX_UV_LOCK_SHA256="@uvLockSha256@"
self_path="$("@readlink@" -f "${BASH_SOURCE[0]}")"
export AUTOTUNE_NIX_STORE_PATH="${self_path%/bin/*}"

exec "@program@" @programArgs@ "$@"
