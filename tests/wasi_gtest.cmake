# GoogleTest for WebAssembly/WASI (QKV_WASI), built from Debian's source
# (googletest, a dependency of libgtest-dev) with the project's compiler: no
# threads, no exceptions, no stream capture (WASI has no dup), no death
# tests. Defines GTest::gtest and GTest::gtest_main, and fills FindGTest's
# cache entries so that find_package(GTest) in the test directories finds
# them rather than the host's.
set(_qkv_gt ${QKV_GTEST_SOURCE_DIR}/googletest)
if(NOT EXISTS ${_qkv_gt}/src/gtest-all.cc)
  message(FATAL_ERROR "GoogleTest's source not found in ${QKV_GTEST_SOURCE_DIR} (apt-get install googletest)")
endif()
add_library(qkv_gtest STATIC ${_qkv_gt}/src/gtest-all.cc)
target_include_directories(qkv_gtest SYSTEM PUBLIC ${_qkv_gt}/include)
target_include_directories(qkv_gtest PRIVATE ${_qkv_gt})
target_compile_definitions(qkv_gtest PUBLIC
  GTEST_HAS_PTHREAD=0 GTEST_HAS_EXCEPTIONS=0 GTEST_HAS_STREAM_REDIRECTION=0
  GTEST_HAS_DEATH_TEST=0 GTEST_HAS_POSIX_RE=0)
add_library(qkv_gtest_main STATIC ${_qkv_gt}/src/gtest_main.cc)
target_link_libraries(qkv_gtest_main PUBLIC qkv_gtest)
add_library(GTest::gtest ALIAS qkv_gtest)
add_library(GTest::gtest_main ALIAS qkv_gtest_main)
set(GTEST_INCLUDE_DIR ${_qkv_gt}/include CACHE PATH "" FORCE)
set(GTEST_LIBRARY qkv_gtest CACHE STRING "" FORCE)
set(GTEST_MAIN_LIBRARY qkv_gtest_main CACHE STRING "" FORCE)
unset(_qkv_gt)
