# readme_blocks(TEXT LANG OUT): the ```LANG code blocks of a README's TEXT, joined into OUT,
# for the tests that compile what the README shows (tests/CMakeLists.txt: test_readme;
# tests/package/readme_project.cmake: the README's project). TEXT must have had its ';'
# replaced by "<semicolon>" (CMake lists split on ';'); OUT has them back. OUT is empty when
# the README has no block of LANG.
function(readme_blocks text lang out)
  string(REGEX MATCHALL "```${lang}\n[^`]*```" blocks "${text}")
  set(code "")
  foreach(block IN LISTS blocks)
    string(REGEX REPLACE "^```${lang}\n" "" block "${block}")
    string(REGEX REPLACE "```$" "" block "${block}")
    string(APPEND code "${block}\n")
  endforeach()
  string(REPLACE "<semicolon>" ";" code "${code}")
  set(${out} "${code}" PARENT_SCOPE)
endfunction()
