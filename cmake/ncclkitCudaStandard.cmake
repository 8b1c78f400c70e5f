# ncclkit_give_cuda_cxx20(<target>): CUDA sources of targets that link <target> get -std=c++20
# when they ask for no CUDA standard of their own (nvcc 12 and 13 default to C++17, and
# ncclkit needs C++20). With CMake < 3.26, which knows no nvcc flag for CUDA 20, also when
# they ask for 20: there CMAKE_CUDA_STANDARD 20 or cuda_std_20 adds no flag at all.
# "Ask" means the target's CUDA_STANDARD (CMAKE_CUDA_STANDARD), a cuda_std_* compile feature of
# the target's own, or a -std in CMAKE_CUDA_FLAGS: then CMake or the user gives nvcc its -std,
# and a second one would override it (nvcc takes the last). A target that asks for an older
# standard keeps it, and core/error.hpp stops the build with one message.
# Used by ncclkit's CMakeLists.txt (add_subdirectory) and by ncclkitConfig.cmake (find_package),
# so the decision follows the CMake version of the project that consumes ncclkit.
function(ncclkit_give_cuda_cxx20 target)
  if(CMAKE_CUDA_FLAGS MATCHES "(^| )-std")
    return()
  endif()
  set(standard "$<TARGET_PROPERTY:CUDA_STANDARD>")
  set(features "$<TARGET_PROPERTY:COMPILE_FEATURES>")
  set(older_feature "$<IN_LIST:cuda_std_03,${features}>,$<IN_LIST:cuda_std_11,${features}>,$<IN_LIST:cuda_std_14,${features}>,$<IN_LIST:cuda_std_17,${features}>")
  set(newer_feature "$<IN_LIST:cuda_std_20,${features}>,$<IN_LIST:cuda_std_23,${features}>,$<IN_LIST:cuda_std_26,${features}>")
  if(CMAKE_VERSION VERSION_LESS 3.26)
    set(wanted "$<AND:$<OR:$<STREQUAL:${standard},>,$<STREQUAL:${standard},20>>,$<NOT:$<OR:${older_feature}>>>")
  else()
    set(wanted "$<AND:$<STREQUAL:${standard},>,$<NOT:$<OR:${older_feature},${newer_feature}>>>")
  endif()
  set_property(TARGET ${target} APPEND PROPERTY INTERFACE_COMPILE_OPTIONS
    "$<BUILD_INTERFACE:$<$<AND:$<COMPILE_LANGUAGE:CUDA>,${wanted}>:-std=c++20>>")
endfunction()
