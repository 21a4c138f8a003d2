# The project's CUDA kernels (server/engine/cuda/): built with the CUDA toolkit's nvcc
# (CUDACXX, else /usr/local/cuda/bin/nvcc, else nvcc on PATH) where there is one and the
# torch wheel is a CUDA build; elsewhere not built, and the GPU path uses ATen's kernels
# (`recal-run --version` says which). Not in the sanitizer and fuzz builds, whose flags are
# the host compiler's.
#
# Sets RECAL_HAVE_CUDA_KERNELS.
option(RECAL_CUDA_KERNELS "build the CUDA kernels where nvcc is found" ON)
set(RECAL_HAVE_CUDA_KERNELS OFF)
if(RECAL_CUDA_KERNELS AND RECAL_TORCH_CUDA AND NOT RECAL_SANITIZE AND NOT RECAL_FUZZ)
  if(NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Ampere and Hopper (the H100 and H200 the GPU checks run on), and PTX for what comes after.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 90-virtual)
    endif()
    # The wheel's own CUDA runtime, linked by name below: one runtime in the process with LibTorch's.
    set(CMAKE_CUDA_RUNTIME_LIBRARY None)
    set(CMAKE_CUDA_STANDARD 17)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # The runtime the wheel carries (nvidia/cu*/lib beside torch/), else the toolkit's.
    file(GLOB RECAL_TORCH_CUDART ${RECAL_TORCH_LIB_DIR}/../../nvidia/cu*/lib/libcudart.so.*)
    if(RECAL_TORCH_CUDART)
      list(GET RECAL_TORCH_CUDART 0 RECAL_TORCH_CUDART)
    else()
      set(RECAL_TORCH_CUDART CUDA::cudart)
    endif()
    set(RECAL_HAVE_CUDA_KERNELS ON)
    message(STATUS "CUDA kernels: nvcc ${CMAKE_CUDA_COMPILER_VERSION} for ${CMAKE_CUDA_ARCHITECTURES}, runtime ${RECAL_TORCH_CUDART}")
  endif()
endif()
if(NOT RECAL_HAVE_CUDA_KERNELS)
  message(STATUS "CUDA kernels: not built (no nvcc, a CPU wheel, or a sanitizer or fuzz build)")
endif()
