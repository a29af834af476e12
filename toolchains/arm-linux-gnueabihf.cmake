# 32-bit Arm Linux, hard float: Raspberry Pi OS (32-bit) on Pi 2/3/4, other
# Cortex-A7/A53 boards.
#   dpkg --add-architecture armhf
#   apt-get install g++-arm-linux-gnueabihf qemu-user libhwy-dev:armhf libgtest-dev:armhf
#   cmake -S . -B build-armhf -G Ninja -DCMAKE_TOOLCHAIN_FILE=toolchains/arm-linux-gnueabihf.cmake
# The whole build assumes NEON with VFPv4 (Cortex-A7 and later): Highway's
# NEON target is static on ARMv7 (no runtime dispatch there), the xsimd
# engine is xsimd:neon; Highway's headers need an __fp16 format. The tests
# run under qemu-arm -cpu cortex-a7 (QKV_QEMU_CPU; QEMU_CPU works too).
set(CMAKE_SYSTEM_PROCESSOR armv7l)
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
set(QKV_QEMU_CPU cortex-a7 CACHE STRING
  "qemu -cpu for the tests (empty: QEMU_CPU from the environment, else qemu's default)")
qkv_linux_cross(arm-linux-gnueabihf qemu-arm
  -mcpu=cortex-a7 -mfpu=neon-vfpv4 -mfloat-abi=hard -mfp16-format=ieee)
