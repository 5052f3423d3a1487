# nixpkgs config for the GPU package set: CUDA on, the GPU generations autotune targets, and
# the unfree NVIDIA redistributables (CUDA runtime and compiler, cuBLAS, cuDNN, NCCL...)
# allowed by package name rather than by a blanket allowUnfree.
{ lib }:
let
  unfreeNames = [
    "cuda-merged"
    "cudatoolkit"
    "cudnn"
    "cutensor"
    "cusparselt"
    "nccl"
    "nvshmem"
    "tensorrt"
  ];
  # cuda_cudart, cuda_nvcc, cuda_nvrtc, cuda_cupti, ...; libcublas, libcufft, libcurand,
  # libcusolver, libcusparse, libcusparse_lt, libcufile, libcudss, libcutensor; libnvjitlink,
  # libnpp, libnvshmem: the redistributable set is renamed and split between CUDA releases.
  unfreePrefixes = [
    "cuda_"
    "libcu"
    "libnv"
  ];
in
{
  cudaSupport = true;
  # Ampere (A100, A10/RTX 30), Ada (L4, L40S, RTX 40), Hopper (H100, H200),
  # Blackwell (B200/GB200, RTX 50 / RTX PRO 6000).
  cudaCapabilities = [
    "8.0"
    "8.6"
    "8.9"
    "9.0"
    "10.0"
    "12.0"
  ];
  allowUnfreePredicate =
    pkg:
    let
      name = lib.getName pkg;
    in
    builtins.elem name unfreeNames || lib.any (prefix: lib.hasPrefix prefix name) unfreePrefixes;
}
