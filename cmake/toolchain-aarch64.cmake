# Cross build for aarch64 on an x86-64 Debian 12 host (`make build-arm64`), with the :arm64
# multiarch development packages that `scripts/install-deps.sh --arm64` installs. Code generators
# that run during the build (protoc, grpc_cpp_plugin) are the host's own.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Multiarch keeps target libraries beside the host's (/usr/lib/aarch64-linux-gnu), so the sysroot is
# the host's root; libraries and packages are searched for the target only, programs on the host.
set(CMAKE_FIND_ROOT_PATH /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(PKG_CONFIG_EXECUTABLE aarch64-linux-gnu-pkg-config CACHE FILEPATH "pkg-config for the target")

# ctest runs the target's programs through qemu-user. When the kernel has a binfmt_misc handler
# for aarch64 the programs run as they are (and may exec one another); without one the emulator
# is an explicit prefix, which only covers the program ctest starts itself.
if(EXISTS /proc/sys/fs/binfmt_misc/qemu-aarch64)
  set(IBVX_BINFMT_AARCH64 ON CACHE BOOL "The kernel runs aarch64 programs through qemu (binfmt_misc)")
else()
  set(IBVX_BINFMT_AARCH64 OFF CACHE BOOL "The kernel runs aarch64 programs through qemu (binfmt_misc)")
  find_program(IBVX_QEMU_AARCH64 qemu-aarch64 REQUIRED)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${IBVX_QEMU_AARCH64})
endif()
