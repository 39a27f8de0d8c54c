# Cross build for arm64 Linux (and Android from /data/local/tmp) with Debian's aarch64 cross compiler.
# Static binaries; tests run under qemu-aarch64 (set QEMU_CPU=cortex-a53 to test the fallbacks).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(PI2_STATIC ON CACHE BOOL "" FORCE)
find_program(PI2_QEMU qemu-aarch64)
if(PI2_QEMU)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${PI2_QEMU})
endif()
