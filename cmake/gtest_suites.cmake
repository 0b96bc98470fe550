# Run by kuafu_test_suites (cmake/KuafuTarget.cmake) after a test binary is built: lists its tests and
# writes one CTest test per GoogleTest suite (BINARY --gtest_filter=Suite.*) into OUT, which CTest reads.
# A suite's tests share one process: its SetUpTestSuite fixture and LibTorch's start-up are paid once.
cmake_policy(SET CMP0057 NEW)  # if(IN_LIST)
execute_process(COMMAND "${BINARY}" --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE status
                WORKING_DIRECTORY "${WORKING_DIRECTORY}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${BINARY} --gtest_list_tests failed (${status}):\n${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(script "")
set(suite "")
macro(flush_suite)
  if(NOT suite STREQUAL "")
    set(cost "")
    if("${suite}" IN_LIST SLOW)
      set(cost " COST 1000")
    endif()
    string(APPEND script "add_test([=[${suite}]=] [==[${BINARY}]==] [=[--gtest_filter=${suite}.*]=])\n"
           "set_tests_properties([=[${suite}]=] PROPERTIES WORKING_DIRECTORY [==[${WORKING_DIRECTORY}]==] "
           "TIMEOUT ${TIMEOUT}${cost})\n")
  endif()
endmacro()
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( |$)")       # "Suite." or "Prefix/Suite.  # TypeParam = ..."
    flush_suite()
    set(suite "${CMAKE_MATCH_1}")
  endif()
endforeach()
flush_suite()
file(WRITE "${OUT}" "${script}")
