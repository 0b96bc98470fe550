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
