# All dependencies are Debian packages installed by scripts/setup.
# Boost: whatever the Debian release ships (1.74 on Debian 12, 1.83 on Debian 13); 1.74 is
# the oldest whose Asio and Process the code is written against.
find_package(Threads REQUIRED)
# CMake 3.30+ (Debian 13): Boost's own BoostConfig.cmake, not the retired FindBoost module.
if(POLICY CMP0167)
  cmake_policy(SET CMP0167 NEW)
endif()
find_package(Boost 1.74 REQUIRED COMPONENTS filesystem)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)

# LibTorch is optional for the launcher side and must never reach it; only
# worker_runtime, trainers and bench may link it.
find_package(Torch QUIET)
if(Torch_FOUND)
  message(STATUS "ddprun: LibTorch found (${Torch_DIR})")
else()
  message(STATUS "ddprun: LibTorch not found; torch-based targets are skipped")
endif()

# CUDA and NCCL are optional: detected, never required.
find_path(DDPRUN_NCCL_INCLUDE_DIR nccl.h HINTS /usr/local/cuda/include)
find_library(DDPRUN_NCCL_LIBRARY nccl HINTS /usr/local/cuda/lib64 /usr/local/cuda/lib)
find_path(DDPRUN_CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS /usr/local/cuda/include)
find_library(DDPRUN_CUDART_LIBRARY cudart HINTS /usr/local/cuda/lib64 /usr/local/cuda/lib)
if(DDPRUN_NCCL_INCLUDE_DIR AND DDPRUN_NCCL_LIBRARY)
  set(DDPRUN_HAVE_NCCL ON)
  message(STATUS "ddprun: NCCL found (${DDPRUN_NCCL_LIBRARY})")
else()
  set(DDPRUN_HAVE_NCCL OFF)
  message(STATUS "ddprun: CUDA/NCCL not found")
endif()

# The LibTorch found decides whether the CUDA tensor paths are built: a CUDA-enabled one (its
# torch_cuda target, as pip's torch has) turns them on. DDPRUN_TORCH_CUDA_PREFIX names an
# unpacked CUDA LibTorch of the same version as the one found (scripts/setup-torch-cuda: Debian
# 13's libtorch-cuda-dev and libtorch-cuda-2.6 in the torch 2.x root) whose headers and
# libraries then replace the found one's: how CI compiles and links the CUDA code without a GPU.
set(DDPRUN_TORCH_CUDA_PREFIX "" CACHE PATH "An unpacked CUDA LibTorch replacing the found LibTorch (CI's CUDA build)")
set(DDPRUN_TORCH_CUDA OFF)
if(Torch_FOUND AND DDPRUN_TORCH_CUDA_PREFIX)
  if(NOT DDPRUN_CUDART_INCLUDE_DIR OR NOT DDPRUN_CUDART_LIBRARY OR NOT DDPRUN_HAVE_NCCL)
    message(FATAL_ERROR "DDPRUN_TORCH_CUDA_PREFIX needs the CUDA toolkit's headers and NCCL (/usr/local/cuda)")
  endif()
  set(_torch_cuda_lib "${DDPRUN_TORCH_CUDA_PREFIX}/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}")
  if(NOT EXISTS "${_torch_cuda_lib}/libtorch_cuda.so")
    message(FATAL_ERROR "DDPRUN_TORCH_CUDA_PREFIX: no ${_torch_cuda_lib}/libtorch_cuda.so")
  endif()
  set(TORCH_INCLUDE_DIRS "${DDPRUN_TORCH_CUDA_PREFIX}/usr/include"
    "${DDPRUN_TORCH_CUDA_PREFIX}/usr/include/torch/csrc/api/include" "${DDPRUN_CUDART_INCLUDE_DIR}")
  set(TORCH_LIBRARIES "${_torch_cuda_lib}/libtorch.so" "${_torch_cuda_lib}/libtorch_cpu.so"
    "${_torch_cuda_lib}/libtorch_cuda.so" "${_torch_cuda_lib}/libc10_cuda.so" "${_torch_cuda_lib}/libc10.so"
    "${DDPRUN_CUDART_LIBRARY}")
  # Those libraries name CUDA 12 sonames and cuDNN that are not here: link anyway. These
  # binaries are for the compile and link check only; the GPU machine builds against its own.
  add_link_options(LINKER:--allow-shlib-undefined)
  set(DDPRUN_TORCH_CUDA ON)
  message(STATUS "ddprun: CUDA LibTorch from ${DDPRUN_TORCH_CUDA_PREFIX} (compile and link only)")
elseif(Torch_FOUND AND TARGET torch_cuda)
  set(DDPRUN_TORCH_CUDA ON)
  message(STATUS "ddprun: LibTorch has CUDA")
endif()
if(DDPRUN_TORCH_CUDA AND NOT DDPRUN_HAVE_NCCL)
  message(FATAL_ERROR "LibTorch has CUDA but NCCL was not found: set DDPRUN_NCCL_INCLUDE_DIR and DDPRUN_NCCL_LIBRARY")
endif()
