# Writes the project a README reader would write, from README.md itself, so that CI builds
# and runs exactly what the README shows (.ci/run, stage "package"):
#   cmake -DREADME=<repo>/README.md -DREPO=<repo> -DOUT=<dir> -DMODE=subdirectory|package
#         -P tests/package/readme_project.cmake
# OUT/CMakeLists.txt  the README's ```cmake block; with MODE=package its add_subdirectory(ncclkit)
#                     line becomes the find_package(ncclkit CONFIG REQUIRED) its comment offers
# OUT/main.cpp        the README's ```cpp blocks (the tour, with its main())
# OUT/gpu.cu          the README's ```cuda blocks, and a main() that links them (built by
#                     tests/package/cuda, compiled and linked only: CI has no GPU)
# OUT/ncclkit         MODE=subdirectory: a link to the repository, where the README puts it
cmake_minimum_required(VERSION 3.24)
foreach(required README REPO OUT MODE)
  if(NOT DEFINED ${required})
    message(FATAL_ERROR "readme_project.cmake: -D${required}=... is required")
  endif()
endforeach()

file(READ "${README}" text)
string(REPLACE ";" "<semicolon>" text "${text}")  # CMake lists split on ';'

include(${CMAKE_CURRENT_LIST_DIR}/../readme_blocks.cmake)
# The blocks of one language, joined; fails when there is none.
function(readme_code lang out)
  readme_blocks("${text}" ${lang} code)
  if(code STREQUAL "")
    message(FATAL_ERROR "README.md has no ```${lang} block")
  endif()
  set(${out} "${code}" PARENT_SCOPE)
endfunction()

readme_code(cmake cmake_code)
set(subdirectory_line "add_subdirectory(ncclkit)")
set(package_line "find_package(ncclkit CONFIG REQUIRED)")
foreach(line IN ITEMS subdirectory_line package_line)
  string(FIND "${cmake_code}" "${${line}}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "README.md's ```cmake block lacks \"${${line}}\"; this test builds the "
                        "README's snippet both ways and needs both spelled out")
  endif()
endforeach()
if(MODE STREQUAL "package")
  string(REGEX REPLACE "add_subdirectory\\(ncclkit\\)[^\n]*" "${package_line}" cmake_code "${cmake_code}")
elseif(MODE STREQUAL "subdirectory")
  file(REMOVE "${OUT}/ncclkit")
  file(MAKE_DIRECTORY "${OUT}")
  file(CREATE_LINK "${REPO}" "${OUT}/ncclkit" SYMBOLIC)
else()
  message(FATAL_ERROR "readme_project.cmake: MODE must be subdirectory or package, not '${MODE}'")
endif()
file(WRITE "${OUT}/CMakeLists.txt" "${cmake_code}")

readme_code(cpp cpp_code)
file(WRITE "${OUT}/main.cpp" "${cpp_code}")

readme_code(cuda cuda_code)
file(WRITE "${OUT}/gpu.cu" "${cuda_code}\n// Added by tests/package/readme_project.cmake: link the GPU tour.\n"
                           "int main(int argc, char**) {\n"
                           "  return argc < 0 ? average_on_gpu(ncclkit::detect_world(), nullptr, 0, nullptr), 1 : 0;\n"
                           "}\n")
message(STATUS "wrote the README's project (${MODE}) to ${OUT}")
