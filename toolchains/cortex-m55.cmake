# Cortex-M55 microcontrollers with Helium (MVE-F): Corstone-300, Alif Ensemble.
#   apt-get install gcc-arm-none-eabi picolibc-arm-none-eabi \
#     libstdc++-arm-none-eabi-picolibc qemu-system-arm
#   cmake -S . -B build-m55 -G Ninja -DCMAKE_TOOLCHAIN_FILE=toolchains/cortex-m55.cmake
# Builds libqkv.a with the Helium engine (default backend) and the reference
# engine, and tests/mcu; ctest runs the runner on QEMU's mps3-an547 board.
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
qkv_bare_metal(mps3-an547 mps3-an547.ld
  -mcpu=cortex-m55 -mthumb -mfloat-abi=hard)
