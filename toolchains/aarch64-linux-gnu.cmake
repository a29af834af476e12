# 64-bit Arm Linux: Raspberry Pi 4/5, Jetson, Graviton.
#   apt-get install g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libgtest-dev:arm64
#   cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=toolchains/aarch64-linux-gnu.cmake
# Highway compiles NEON, SVE and SVE2 and picks one at run time; the tests run
# under qemu-aarch64 (QEMU_CPU=cortex-a72: NEON; QEMU_CPU=max: SVE2, 512-bit).
set(CMAKE_SYSTEM_PROCESSOR aarch64)
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
qkv_linux_cross(aarch64-linux-gnu qemu-aarch64)
