# Cortex-M4F microcontrollers (STM32F4-class: single-precision FPU, no SIMD).
#   apt-get install gcc-arm-none-eabi picolibc-arm-none-eabi \
#     libstdc++-arm-none-eabi-picolibc qemu-system-arm
#   cmake -S . -B build-m4 -G Ninja -DCMAKE_TOOLCHAIN_FILE=toolchains/cortex-m4.cmake
# Builds libqkv.a (reference engine) and tests/mcu; ctest runs the runner on
# QEMU's mps2-an386 board (Cortex-M4F) with semihosting.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
qkv_bare_metal(mps2-an386 mps2-an386.ld
  -mcpu=cortex-m4 -mthumb -mfpu=fpv4-sp-d16 -mfloat-abi=hard)
list(INSERT CMAKE_CROSSCOMPILING_EMULATOR 3 -cpu cortex-m4)
