# WebAssembly for WASI runtimes (wasmtime, wasmer, node, browsers with a WASI
# shim): clang-14 and Debian's WASI sysroot.
#   apt-get install clang-14 lld-14 llvm-14 wasi-libc libc++-14-dev-wasm32 \
#     libc++abi-14-dev-wasm32 libclang-rt-14-dev-wasm32 libhwy-dev googletest nodejs
#   cmake -S . -B build-wasm -G Ninja -DCMAKE_TOOLCHAIN_FILE=toolchains/wasm32-wasi.cmake
# Engines: Highway's WASM target (128-bit SIMD, -msimd128), static: only
# Highway's headers are used (HWY_COMPILE_ONLY_STATIC; there is no libhwy for
# wasm), and the reference engine. No threads, no exceptions, no shared
# library. GoogleTest is built from Debian's source (/usr/src/googletest)
# without threads or exceptions; the thread-pool suites and
# tests/reliability are left out. Programs run under node's WASI
# (toolchains/wasi-run.mjs); they are named *.wasm.
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR wasm32)
set(QKV_WASI_TRIPLE wasm32-wasi)
set(CMAKE_C_COMPILER clang-14)
set(CMAKE_CXX_COMPILER clang++-14)
set(CMAKE_C_COMPILER_TARGET ${QKV_WASI_TRIPLE})
set(CMAKE_CXX_COMPILER_TARGET ${QKV_WASI_TRIPLE})
# clang's WASI driver finds Debian's sysroot by itself (headers in
# /usr/include/wasm32-wasi, libraries in /usr/lib/wasm32-wasi) and links with
# wasm-ld; only packages are looked up in a root of their own, so nothing of
# the host's (x86-64 libhwy, GTest) is picked up.
set(CMAKE_FIND_ROOT_PATH /usr/lib/wasm32-wasi)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_EXECUTABLE_SUFFIX_C .wasm)
set(CMAKE_EXECUTABLE_SUFFIX_CXX .wasm)

# 128-bit SIMD (every current browser and runtime has it). No exceptions in
# clang-14's wasm32: the library never uses them, GoogleTest copes.
# clock() (the examples time themselves) is wasi-libc's emulation on the
# wall clock.
set(CMAKE_C_FLAGS_INIT "-msimd128 -D_WASI_EMULATED_PROCESS_CLOCKS")
set(CMAKE_CXX_FLAGS_INIT "-msimd128 -fno-exceptions -D_WASI_EMULATED_PROCESS_CLOCKS")
# wasm-ld's default stack is 64 KiB; the tests keep some arrays on it.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-Wl,-z,stack-size=1048576")
set(CMAKE_C_STANDARD_LIBRARIES "-lwasi-emulated-process-clocks" CACHE STRING "")
set(CMAKE_CXX_STANDARD_LIBRARIES "-lwasi-emulated-process-clocks" CACHE STRING "")

set(QKV_WASI ON CACHE BOOL "WebAssembly/WASI build (set by toolchains/wasm32-wasi.cmake)")
set(QKV_HIGHWAY_HEADER_ONLY ON CACHE BOOL "")
set(QKV_XSIMD OFF CACHE STRING "")       # xsimd 8.1 has no wasm backend
set(QKV_BUILD_BENCH OFF CACHE STRING "")
set(QKV_PYTHON_TESTS OFF CACHE STRING "")
set(QKV_GTEST_SOURCE_DIR /usr/src/googletest CACHE PATH
  "GoogleTest's source, built for the target (Debian's googletest package)")
find_program(QKV_NODE NAMES node nodejs REQUIRED)
# --single-threaded-gc: node 20's V8 crashes at exit (SIGSEGV, SIGTRAP)
# after the whole suite has passed, its concurrent GC threads racing the
# teardown; with one GC thread it exits cleanly, as fast.
set(CMAKE_CROSSCOMPILING_EMULATOR ${QKV_NODE} --single-threaded-gc
  --experimental-wasi-unstable-preview1 --no-warnings
  ${CMAKE_CURRENT_LIST_DIR}/wasi-run.mjs)
