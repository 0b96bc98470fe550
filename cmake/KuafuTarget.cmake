# kuafu_torch_target(<target>): project warnings, include root, and the shared precompiled header.
function(kuafu_common_target target)
  target_compile_options(${target} PRIVATE ${KUAFU_WARNINGS})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()

function(kuafu_torch_target target)
  kuafu_common_target(${target})
  if(TARGET kuafu_torch_base AND NOT target STREQUAL kuafu_torch_base)
    target_precompile_headers(${target} REUSE_FROM kuafu_torch_base)
  endif()
endfunction()

# kuafu_test_suites(<target> TIMEOUT <s>): one CTest test per GoogleTest suite of <target>, listed after
# each build (cmake/gtest_suites.cmake). Each suite runs in one process.
# SLOW: suites CTest starts first (a fresh build has no timings to order by), so a long one does not run
# alone at the end.
function(kuafu_test_suites target)
  cmake_parse_arguments(SUITES "" "TIMEOUT" "SLOW" ${ARGN})
  set(listing "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -DBINARY=$<TARGET_FILE:${target}> -DOUT=${listing} -DTIMEOUT=${SUITES_TIMEOUT}
            "-DSLOW=${SUITES_SLOW}"
            -DWORKING_DIRECTORY=${CMAKE_CURRENT_BINARY_DIR} -P ${PROJECT_SOURCE_DIR}/cmake/gtest_suites.cmake
    BYPRODUCTS ${listing} VERBATIM)
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${listing})
endfunction()
