# ncclkit_give_cuda_cxx20(<target>): CUDA sources of targets that link <target> get -std=c++20
# when they ask for no CUDA standard of their own (nvcc 12 and 13 default to C++17, and
# ncclkit needs C++20). With CMake < 3.26, which knows no nvcc flag for CUDA 20, also when
# they ask for 20: there CMAKE_CUDA_STANDARD 20 or cuda_std_20 adds no flag at all.
# A target that asks for another standard keeps it; below 20, core/error.hpp stops the build
# with one message.
# Used by ncclkit's CMakeLists.txt (add_subdirectory) and by ncclkitConfig.cmake (find_package),
# so the decision follows the CMake version of the project that consumes ncclkit.
function(ncclkit_give_cuda_cxx20 target)
  set(standard "$<TARGET_PROPERTY:CUDA_STANDARD>")
  if(CMAKE_VERSION VERSION_LESS 3.26)
    set(wanted "$<OR:$<STREQUAL:${standard},>,$<STREQUAL:${standard},20>>")
  else()
    set(wanted "$<STREQUAL:${standard},>")
  endif()
  set_property(TARGET ${target} APPEND PROPERTY INTERFACE_COMPILE_OPTIONS
    "$<BUILD_INTERFACE:$<$<AND:$<COMPILE_LANGUAGE:CUDA>,${wanted}>:-std=c++20>>")
endfunction()
