# tests_nccl_fake: tests/fake/test_*.cpp (the NCCL backend's watchdog, group and abort logic,
# Options' ncclConfig_t knobs, the argument check, why the fused compressed all-reduce does not
# run and when that is a warning) against a fake CUDA runtime and NCCL
# (tests/support/fake_cuda_nccl.hpp), label `host`, so that they run on every machine with the
# CUDA and NCCL headers, GPU or not.
#
# include()d by tests/CMakeLists.txt after ncclkit_test_main and ncclkit_apply_test_properties
# are defined. Only headers are needed: the fake defines the CUDA runtime and NCCL functions
# the headers call, so the test links neither libcudart nor libnccl (either would clash with
# it). The source lives in tests/fake/, out of reach of the tests/host/test_*.cpp glob, which
# would build it without the fake.

# Headers only, so it is built with NCCLKIT_WITH_CUDA=OFF too (CI's sanitizer stage runs it).
if(NOT TARGET ncclkit_test_main OR NOT COMMAND ncclkit_add_test_executable)
  message(FATAL_ERROR "tests/fake_nccl.cmake: include it after ncclkit_test_main and "
                      "ncclkit_add_test_executable are defined (tests/CMakeLists.txt)")
endif()

# The toolkit's headers (cuda_runtime_api.h, cuda.h, cuda_fp16.h, nvtx3/) and nccl.h: where the
# top-level CMakeLists found them, else the usual places (a machine may have the headers
# without nvcc or libnccl, which the top level needs for NCCLKIT_HAVE_CUDA / _NCCL).
find_path(NCCLKIT_FAKE_CUDA_INCLUDE_DIR cuda_runtime_api.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} "$ENV{CUDA_HOME}/include" "$ENV{CUDA_PATH}/include" /usr/local/cuda/include)
find_path(NCCLKIT_FAKE_NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_INCLUDE_DIR} "$ENV{NCCL_ROOT}/include" "$ENV{NCCL_HOME}/include" ${NCCLKIT_FAKE_CUDA_INCLUDE_DIR})
mark_as_advanced(NCCLKIT_FAKE_CUDA_INCLUDE_DIR NCCLKIT_FAKE_NCCL_INCLUDE_DIR)
if(NOT NCCLKIT_FAKE_CUDA_INCLUDE_DIR OR NOT NCCLKIT_FAKE_NCCL_INCLUDE_DIR
   OR NOT EXISTS "${NCCLKIT_FAKE_CUDA_INCLUDE_DIR}/nvtx3/nvToolsExt.h")
  ncclkit_missing("The CUDA toolkit's headers (cuda_runtime_api.h, nvtx3/) and nccl.h"
    "tests_nccl_fake (the NCCL backend against a fake CUDA and NCCL)"
    "Install the CUDA toolkit's headers and NCCL's (libnccl-dev), or set CUDA_HOME and NCCL_ROOT.")
  return()
endif()

# ncclkit needs NCCL 2.18 or newer (include/ncclkit/nccl/types.hpp stops the build otherwise).
file(STRINGS "${NCCLKIT_FAKE_NCCL_INCLUDE_DIR}/nccl.h" _fake_nccl_version REGEX "^#define NCCL_(MAJOR|MINOR) ")
string(REGEX MATCH "NCCL_MAJOR +([0-9]+)" _fake_nccl_major "${_fake_nccl_version}")
set(_fake_nccl_major "${CMAKE_MATCH_1}")
string(REGEX MATCH "NCCL_MINOR +([0-9]+)" _fake_nccl_minor "${_fake_nccl_version}")
set(_fake_nccl_minor "${CMAKE_MATCH_1}")
if("${_fake_nccl_major}.${_fake_nccl_minor}" VERSION_LESS 2.18)
  ncclkit_missing("NCCL 2.18 or newer (${NCCLKIT_FAKE_NCCL_INCLUDE_DIR}/nccl.h is NCCL "
                  "${_fake_nccl_major}.${_fake_nccl_minor})"
    "tests_nccl_fake (the NCCL backend against a fake CUDA and NCCL)" "Install NCCL 2.18 or newer, or set NCCL_ROOT.")
  return()
endif()

file(GLOB _fake_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/fake/test_*.cpp)
ncclkit_add_test_executable(tests_nccl_fake host ${_fake_tests} ${CMAKE_CURRENT_LIST_DIR}/support/fake_cuda_nccl.cpp)
target_include_directories(tests_nccl_fake SYSTEM PRIVATE
  ${NCCLKIT_FAKE_CUDA_INCLUDE_DIR} ${NCCLKIT_FAKE_NCCL_INCLUDE_DIR})
# No CUDA::cudart, no NCCL::nccl: the fake is both.
target_link_libraries(tests_nccl_fake PRIVATE ncclkit_test_main Threads::Threads)
