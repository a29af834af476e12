# Shared bits of qkv's toolchain files (include()d by each of them; see the
# README's "Cross-compiling" section).
#
#   qkv_linux_cross(<triple> <qemu-user binary> [<cpu flags...>])
#       A Debian cross compiler (<triple>-gcc/-g++), libraries from Debian's
#       multiarch packages (libhwy-dev:<arch>, libgtest-dev:<arch>), and the
#       tests run under qemu-user. QKV_QEMU_CPU picks the emulated CPU; when
#       empty, qemu reads QEMU_CPU from the environment (or uses its default,
#       "max"). The cpu flags, if any, go into every C and C++ compile (and
#       link) of the project: e.g. 32-bit ARM's FPU and float ABI.
#
#   qkv_bare_metal(<machine> <linker script> <cpu flags...>)
#       arm-none-eabi-gcc with picolibc and semihosting: no OS, no heap use by
#       qkv, main's return value is qemu's exit status. Builds the library
#       (reference engine) and tests/mcu only (QKV_MCU).

set(QKV_TOOLCHAIN_DIR ${CMAKE_CURRENT_LIST_DIR})

macro(qkv_linux_cross triple qemu)
  set(CMAKE_SYSTEM_NAME Linux)
  set(CMAKE_C_COMPILER ${triple}-gcc)
  set(CMAKE_CXX_COMPILER ${triple}-g++)
  # Debian multiarch: headers in /usr/include, libraries and CMake packages
  # in /usr/lib/${triple}; CMake finds those through CMAKE_LIBRARY_ARCHITECTURE
  # (detected from the compiler). No sysroot, no host programs mixed in.
  set(CMAKE_LIBRARY_ARCHITECTURE ${triple})
  set(CMAKE_FIND_ROOT_PATH /usr/${triple})
  set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
  set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
  set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
  set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
  set(QKV_QEMU_CPU "" CACHE STRING
    "qemu -cpu for the tests (empty: QEMU_CPU from the environment, else qemu's default)")
  # The loader comes from the cross runtime (libc6-<arch>-cross, through -L);
  # without LD_LIBRARY_PATH it would take libc.so.6 from the multiarch
  # libc6:<arch> (pulled in by libhwy-dev:<arch>) through the host's
  # ld.so.cache, a different glibc build: the first pthread_create then hangs
  # (aarch64) or crashes (armhf). So the whole C/C++ runtime is the cross one.
  set(CMAKE_CROSSCOMPILING_EMULATOR ${qemu} -L /usr/${triple}
    -E LD_LIBRARY_PATH=/usr/${triple}/lib)
  if(QKV_QEMU_CPU)
    list(APPEND CMAKE_CROSSCOMPILING_EMULATOR -cpu ${QKV_QEMU_CPU})
  endif()
  # The Python binding loads the library into the host's python3: not here.
  set(QKV_PYTHON_TESTS OFF CACHE STRING "")
  if(NOT "${ARGN}" STREQUAL "")
    string(REPLACE ";" " " _qkv_cpu_flags "${ARGN}")
    set(CMAKE_C_FLAGS_INIT "${_qkv_cpu_flags}")
    set(CMAKE_CXX_FLAGS_INIT "${_qkv_cpu_flags}")
  endif()
endmacro()

macro(qkv_bare_metal machine linker_script)
  set(CMAKE_SYSTEM_NAME Generic)
  set(CMAKE_SYSTEM_PROCESSOR arm)
  set(CMAKE_C_COMPILER arm-none-eabi-gcc)
  set(CMAKE_CXX_COMPILER arm-none-eabi-g++)
  set(CMAKE_ASM_COMPILER arm-none-eabi-gcc)
  # Test programs are linked only by the real build (which has the specs and
  # the linker script); CMake's compiler checks build a static library.
  set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
  set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
  set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
  set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
  set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
  set(CMAKE_FIND_ROOT_PATH /usr/lib/picolibc/arm-none-eabi)

  string(REPLACE ";" " " _qkv_cpu_flags "${ARGN}")
  # picolibc's C++ specs (libstdc++-arm-none-eabi-picolibc); -ffunction- and
  # -fdata-sections with --gc-sections keep only what the program uses.
  # -fno-short-enums: arm-none-eabi makes enums as small as their values by
  # default, which would shrink qkv_status and qkv_score (and the descriptor)
  # below the 32 bits the C ABI pins; libc's objects use short enums but pass
  # none across, hence --no-enum-size-warning.
  set(_qkv_flags "${_qkv_cpu_flags} --specs=picolibcpp.specs -fno-short-enums -ffunction-sections -fdata-sections")
  set(CMAKE_C_FLAGS_INIT "${_qkv_flags}")
  set(CMAKE_CXX_FLAGS_INIT "${_qkv_flags} -fno-exceptions -fno-rtti -fno-threadsafe-statics")
  set(CMAKE_ASM_FLAGS_INIT "${_qkv_cpu_flags}")
  # Semihosting: stdout goes to qemu's console, main's return value becomes
  # qemu's exit status (picolibc's semihost crt0 calls SYS_EXIT_EXTENDED).
  set(CMAKE_EXE_LINKER_FLAGS_INIT
    "--oslib=semihost --crt0=semihost -T${QKV_TOOLCHAIN_DIR}/${linker_script} -Wl,--gc-sections -Wl,--no-enum-size-warning")

  set(QKV_MCU ON CACHE BOOL "Microcontroller build: library and tests/mcu only")
  set(QKV_MCU_MACHINE ${machine} CACHE STRING "qemu-system-arm -M for tests/mcu")
  set(QKV_HIGHWAY OFF CACHE STRING "")
  set(QKV_XSIMD OFF CACHE STRING "")
  set(QKV_BUILD_BENCH OFF CACHE STRING "")
  set(CMAKE_CROSSCOMPILING_EMULATOR qemu-system-arm -M ${machine} -nographic
    -semihosting-config enable=on,target=native -kernel)
endmacro()
