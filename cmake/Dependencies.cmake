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
if(DDPRUN_NCCL_INCLUDE_DIR AND DDPRUN_NCCL_LIBRARY AND DDPRUN_CUDART_LIBRARY)
  set(DDPRUN_HAVE_NCCL ON)
  message(STATUS "ddprun: CUDA runtime and NCCL found (${DDPRUN_NCCL_LIBRARY})")
else()
  set(DDPRUN_HAVE_NCCL OFF)
  message(STATUS "ddprun: CUDA/NCCL not found; the NCCL backend is not built")
endif()
