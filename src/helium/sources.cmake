# The Helium (MVE) engine: included by the top-level CMakeLists.txt on
# microcontroller builds (QKV_MCU). QKV_HELIUM=AUTO builds it when the target
# CPU has MVE with floating point (e.g. -mcpu=cortex-m55 or cortex-m85).
set(QKV_HELIUM AUTO CACHE STRING "Build the Helium engine: ON, OFF or AUTO (if the CPU has MVE-F)")
set(QKV_HAVE_HELIUM OFF)
if(NOT QKV_HELIUM STREQUAL "OFF")
  include(CheckCXXSourceCompiles)
  check_cxx_source_compiles("
#include <arm_mve.h>
#if !defined(__ARM_FEATURE_MVE) || !(__ARM_FEATURE_MVE & 2)
#error no MVE floating point
#endif
int main() { return 0; }" QKV_COMPILER_HAS_MVE_FP)
  if(QKV_COMPILER_HAS_MVE_FP)
    set(QKV_HAVE_HELIUM ON)
  elseif(QKV_HELIUM STREQUAL "ON")
    message(FATAL_ERROR "QKV_HELIUM=ON but the compiler targets no MVE-F CPU (-mcpu=cortex-m55)")
  endif()
endif()
message(STATUS "qkv: Helium engine ${QKV_HAVE_HELIUM}")
if(QKV_HAVE_HELIUM)
  target_sources(qkv_objects PRIVATE ${CMAKE_CURRENT_LIST_DIR}/attention_helium.cc)
  target_compile_definitions(qkv_objects PRIVATE QKV_HAVE_HELIUM=1)
endif()
