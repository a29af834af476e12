# The xsimd engine's sources (included by the top-level CMakeLists.txt when
# xsimd/xsimd.hpp is found). Sets QKV_XSIMD_SOURCES: engines.cc (baseline
# flags, the runtime CPU check) and one kernel file per architecture, each
# compiled with that architecture's flags.
set(_qkv_xs ${CMAKE_CURRENT_LIST_DIR})
set(QKV_XSIMD_SOURCES ${_qkv_xs}/engines.cc)
set(_qkv_xs_defs "")
string(TOLOWER "${CMAKE_SYSTEM_PROCESSOR}" _qkv_xs_cpu)

if(_qkv_xs_cpu MATCHES "^(x86_64|amd64|x64|i[3-6]86|x86)$")
  list(APPEND QKV_XSIMD_SOURCES
    ${_qkv_xs}/attention_xsimd_sse4_2.cc
    ${_qkv_xs}/attention_xsimd_avx2.cc
    ${_qkv_xs}/attention_xsimd_avx512f.cc)
  set_source_files_properties(${_qkv_xs}/attention_xsimd_sse4_2.cc
    PROPERTIES COMPILE_OPTIONS "-msse4.2;${QKV_SIMD_OPT_FLOOR}")
  set_source_files_properties(${_qkv_xs}/attention_xsimd_avx2.cc
    PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;${QKV_SIMD_OPT_FLOOR}")
  set_source_files_properties(${_qkv_xs}/attention_xsimd_avx512f.cc
    PROPERTIES COMPILE_OPTIONS
      "-mavx512f;-mavx512cd;-mavx512dq;-mavx512bw;-mavx512vl;-mfma;${QKV_SIMD_OPT_FLOOR}")
  list(APPEND _qkv_xs_defs QKV_XSIMD_SSE4_2=1 QKV_XSIMD_AVX2=1 QKV_XSIMD_AVX512F=1)
elseif(_qkv_xs_cpu MATCHES "^(aarch64|arm64|armv8.*)$")
  # Advanced SIMD is baseline on AArch64: no flags.
  list(APPEND QKV_XSIMD_SOURCES ${_qkv_xs}/attention_xsimd_neon64.cc)
  set_source_files_properties(${_qkv_xs}/attention_xsimd_neon64.cc
    PROPERTIES COMPILE_OPTIONS "${QKV_SIMD_OPT_FLOOR}")
  list(APPEND _qkv_xs_defs QKV_XSIMD_NEON64=1)
elseif(_qkv_xs_cpu MATCHES "^(armv7.*|armhf|arm)$" AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
  # 32-bit ARM Linux (Cortex-A): NEON is optional there, checked at run time.
  # Microcontrollers (Cortex-M, no NEON) do not build this engine.
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-mfpu=neon-vfpv4 QKV_XSIMD_HAS_MFPU_NEON)
  if(QKV_XSIMD_HAS_MFPU_NEON)
    list(APPEND QKV_XSIMD_SOURCES ${_qkv_xs}/attention_xsimd_neon.cc)
    set_source_files_properties(${_qkv_xs}/attention_xsimd_neon.cc
      PROPERTIES COMPILE_OPTIONS "-mfpu=neon-vfpv4;${QKV_SIMD_OPT_FLOOR}")
    list(APPEND _qkv_xs_defs QKV_XSIMD_NEON=1)
  endif()
endif()
# Other processors: no kernels, XsimdEngines returns none.
set_source_files_properties(${_qkv_xs}/engines.cc
  PROPERTIES COMPILE_DEFINITIONS "${_qkv_xs_defs}")
message(STATUS "qkv: xsimd kernels: ${QKV_XSIMD_SOURCES}")
unset(_qkv_xs)
unset(_qkv_xs_cpu)
unset(_qkv_xs_defs)
