# Compiles each source of a compile-fail test and checks the outcome (run by CTest as
#   cmake -DCOMPILER=... -DFLAGS=a|b|c -DSOURCES=x.cpp|y.cpp -P check.cmake
# with '|' between list items, since CTest would split ';'):
#   ok_*.cpp    must compile: controls that use the same headers, flags and include folders
#               as the failing ones, so that a broken setup cannot pass for the expected error;
#   fail_*.cpp  must not compile, and the first error must contain the text of the source's
#               "// expect-error: TEXT" line (failing for another reason is a test failure).
# Every source given is checked; the test fails at the end if any was wrong.
cmake_minimum_required(VERSION 3.24)

foreach(required COMPILER SOURCES)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "check.cmake: -D${required}=... is required")
  endif()
endforeach()
string(REPLACE "|" ";" flags "${FLAGS}")
string(REPLACE "|" ";" sources "${SOURCES}")

set(controls)
set(failing)
foreach(source IN LISTS sources)
  get_filename_component(name "${source}" NAME)
  if(name MATCHES "^ok_")
    list(APPEND controls "${source}")
  elseif(name MATCHES "^fail_")
    list(APPEND failing "${source}")
  else()
    message(FATAL_ERROR "check.cmake: ${name} is neither ok_* (must compile) nor fail_* (must fail)")
  endif()
endforeach()
# (CMakeLists.txt runs the controls as a fixture that the fail_* checks require.)

set(wrong 0)
foreach(source IN LISTS controls failing)
  get_filename_component(name "${source}" NAME)
  execute_process(COMMAND "${COMPILER}" ${flags} -fsyntax-only "${source}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(name MATCHES "^ok_")
    if(rc EQUAL 0)
      message(STATUS "ok    ${name}: compiles (control)")
    else()
      message(SEND_ERROR "${name} is a control and must compile, but the compiler said (exit ${rc}); "
                         "check the include folders and flags:\n${output}")
      math(EXPR wrong "${wrong} + 1")
    endif()
    continue()
  endif()

  file(STRINGS "${source}" expect_line REGEX "^// expect-error: " LIMIT_COUNT 1)
  string(REGEX REPLACE "^// expect-error: " "" expected "${expect_line}")
  if(expected STREQUAL "")
    message(SEND_ERROR "${name} has no '// expect-error: TEXT' line saying which error it must give")
    math(EXPR wrong "${wrong} + 1")
    continue()
  endif()
  if(rc EQUAL 0)
    message(SEND_ERROR "${name} compiled, but must fail with \"${expected}\"")
    math(EXPR wrong "${wrong} + 1")
    continue()
  endif()
  # The first error, not just any: a source that breaks for another reason first must not
  # pass because the expected text turns up later among follow-on errors.
  string(REGEX MATCH "[^\n]*error:[^\n]*" first_error "${output}")
  string(FIND "${first_error}" "${expected}" at)
  if(at EQUAL -1)
    message(SEND_ERROR "${name} failed to compile, but its first error is not \"${expected}\":\n"
                       "  ${first_error}\nfull output:\n${output}")
    math(EXPR wrong "${wrong} + 1")
  else()
    message(STATUS "ok    ${name}: fails with \"${expected}\"")
  endif()
endforeach()

list(LENGTH controls control_count)
list(LENGTH failing failing_count)
if(wrong GREATER 0)
  message(FATAL_ERROR "${wrong} of the sources (${control_count} controls, ${failing_count} must fail) went wrong")
endif()
message(STATUS "all ${control_count} controls compiled, all ${failing_count} must-fail sources failed as expected")
