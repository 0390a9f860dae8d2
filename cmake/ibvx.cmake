# Build-wide flags and the small helpers every folder uses, so each folder's CMakeLists stays a
# few lines.

set(IBVX_WARNINGS -Wall -Wextra)
if(IBVX_WERROR)
  list(APPEND IBVX_WARNINGS -Werror)
endif()

if(IBVX_ASAN AND IBVX_TSAN)
  message(FATAL_ERROR "IBVX_ASAN and IBVX_TSAN cannot be combined")
endif()
# The sanitizer builds are compiled at -O1 (after the build type's -O2, so it wins), as the
# sanitizers' own documentation advises for readable reports: with AddressSanitizer's
# instrumentation -O2 costs twice the compile time (tests/integration/ops/ctl_test.cpp: 119 s at
# -O2, 60 s at -O1), and these builds exist to run the suite, not to be fast. The cross build's
# code is compiled at -O1 too: under qemu-user on an x86 host neither its speed nor its memory
# ordering is the target's, so -O2 buys that suite nothing but compile time.
# Test code has levels of its own (-O1; -O0 under ASan): tests/CMakeLists.txt.
if(IBVX_ASAN OR IBVX_TSAN OR CMAKE_CROSSCOMPILING)
  add_compile_options(-O1)
endif()
# Every build keeps line tables only (-g1) unless IBVX_FULL_DEBUG_INFO asks for the build type's
# full -g: every backtrace, sanitizer report and gdb breakpoint or step still has file:line; what
# is lost is gdb's view of local variables and types. `make test` compiles the tree four times
# (CI's budget is 50 minutes on 2 cores), and full debug info is a fifth to a quarter of a file's
# compile time (daemon/edge/services.cpp: 38 s with -g, 28 s with -g1; daemon/app/daemon.cpp
# under ASan: 67 s with -g, 54 s with -g1). To debug with locals:
#   make build CMAKE_ARGS=-DIBVX_FULL_DEBUG_INFO=ON
option(IBVX_FULL_DEBUG_INFO "Full debug info (the build type's -g) instead of line tables (-g1)" OFF)
if(NOT IBVX_FULL_DEBUG_INFO)
  add_compile_options($<$<CONFIG:RelWithDebInfo,Debug>:-g1>)
endif()

# ibvx_control_path(): called first in the folders whose code is the control path (daemon/,
# tools/, proto/, the client's broker calls); their code is then compiled without optimisation
# in the ASan build. That code answers gRPC calls, so its speed under ASan is a test's waiting,
# not its result, and at -O0 AddressSanitizer's instrumentation costs half the compile time
# (daemon/edge/services.cpp: 72 s of CPU at -O1, 35 s at -O0). The data path (providers/, the
# face) keeps -O1: the RoCE and restart cases run against its timing.
macro(ibvx_control_path)
  if(IBVX_ASAN AND NOT IBVX_FUZZ)
    add_compile_options(-O0)
  endif()
endmacro()

# ibvx_generated_code(SOURCE...): protoc's output, called in the folder that adds the sources (a
# source's properties are its folder's). The ASan build compiles it without the sanitizers, as
# Debian's libprotobuf and libgrpc, which that code is a thin part of, are built: what the
# suite's ASan and UBSan check is our code, which is instrumented where it calls into the
# messages, and the allocations of uninstrumented code are still ASan's (its malloc serves the
# whole process). Instrumenting the generated code was ~180 s of the ASan build's CPU for code
# nobody here wrote. The fuzz build keeps it: a fuzzer's coverage reaches into the parsers.
function(ibvx_generated_code)
  if(IBVX_ASAN AND NOT IBVX_FUZZ)
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "-fno-sanitize=all")
  endif()
endfunction()

# Hardened as Debian builds its packages (dpkg-buildflags with hardening=+all): the broker is
# root-capable and its engine parses memory tenants write, so a stack overrun must trap, not
# return to an address a tenant chose (docs/security.md); tests/compat/hardening checks every
# installed binary with hardening-check. _FORTIFY_SOURCE needs optimisation and conflicts with
# the sanitizers' interceptors, so those builds leave it out.
add_compile_options(-fstack-protector-strong -fstack-clash-protection)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|i.86)$")
  add_compile_options(-fcf-protection)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
  add_compile_options(-mbranch-protection=standard)
endif()
if(NOT IBVX_ASAN AND NOT IBVX_TSAN AND NOT IBVX_FUZZ)
  add_compile_options($<$<NOT:$<CONFIG:Debug>>:-D_FORTIFY_SOURCE=2>)
endif()
add_link_options(-Wl,-z,relro -Wl,-z,now)
include(CheckPIESupported)
check_pie_supported()
set(CMAKE_POSITION_INDEPENDENT_CODE ON)

# Programs are linked by lld where it is (scripts/install-deps.sh installs it): it links
# ibv-extendd in a quarter of GNU ld's time (0.6 s against 2.5 s), and a build links some 140
# programs, most of them tests. Shared libraries stay with GNU ld: lld 14 writes a version
# script's nodes without their parents and without the version symbols GNU ld defines, and
# libibv_extend.so and the face's libibverbs must carry rdma-core's version nodes as GNU ld makes
# them (tests/compat/abi, tests/integration/verbs/abi_test.cpp). The cross build's programs use
# gold: GCC's aarch64 driver asks for aarch64-linux-gnu-ld.lld, which Debian does not ship.
find_program(IBVX_LLD ld.lld)
set(_ibvx_program "$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>")
if(CMAKE_CROSSCOMPILING)
  add_link_options("$<${_ibvx_program}:-fuse-ld=gold>")
elseif(IBVX_LLD)
  add_link_options("$<${_ibvx_program}:-fuse-ld=lld>")
endif()
if(IBVX_ASAN)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
  if(CMAKE_C_COMPILER_ID STREQUAL "Clang")
    # clang links the sanitizer runtimes into executables only, and its C driver leaves out their
    # C++ half (UBSan's vptr and function-type checks), which a C program loading our C++
    # libraries (libibv_extend.so, drivers) needs; that half in turn needs libstdc++.
    set(_ibvx_c_exe "$<AND:$<LINK_LANGUAGE:C>,$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>>")
    add_link_options("$<${_ibvx_c_exe}:-fsanitize-link-c++-runtime>" "$<${_ibvx_c_exe}:-lstdc++>")
  endif()
endif()
# What tests preload into programs nobody here built (Debian's ibv_devinfo, perftest, python3) so
# they can load our instrumented libraries (the libibverbs face): ASan must come first in a
# process's library list. Empty without ASan.
set(IBVX_SANITIZER_PRELOAD "")
if(IBVX_ASAN)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so
                  OUTPUT_VARIABLE IBVX_SANITIZER_PRELOAD OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
if(IBVX_TSAN)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

# Applies the project's warning set to a target we own (never to generated proto code).
function(ibvx_warnings target)
  target_compile_options(${target} PRIVATE ${IBVX_WARNINGS})
endfunction()

# Include surfaces. Every file includes project headers by their root-relative path
# ("daemon/core/broker.h"), but no target sees the project root: a module's headers are visible
# only through its surface, a directory in the build tree holding a symlink per header
# (surfaces/<target>/daemon/core/broker.h -> <src>/daemon/core/broker.h), which is an include
# directory of that module's target only. A target therefore sees another module's headers exactly
# when it links that module, and the architecture is enforced by the build. include/ (the public C
# API) stays visible to all.
#
# ibvx_surface(TARGET PUBLIC|PRIVATE|INTERFACE PATH...): each PATH (relative to the project root)
# is a header, or a folder whose headers (not those of its subfolders, which are modules of their
# own) join TARGET's surface.
function(ibvx_surface target scope)
  if(scope STREQUAL "PRIVATE")
    set(root ${PROJECT_BINARY_DIR}/surfaces/${target}.private)
  else()
    set(root ${PROJECT_BINARY_DIR}/surfaces/${target})
  endif()
  file(MAKE_DIRECTORY ${root})
  foreach(rel ${ARGN})
    if(rel MATCHES "\\.(h|hpp|inc)$")
      set(headers ${rel})
    else()
      file(GLOB headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}
           ${PROJECT_SOURCE_DIR}/${rel}/*.h ${PROJECT_SOURCE_DIR}/${rel}/*.hpp ${PROJECT_SOURCE_DIR}/${rel}/*.inc)
    endif()
    foreach(h ${headers})
      # Never removed or rewritten: a stale link to a deleted header only dangles.
      if(NOT IS_SYMLINK ${root}/${h})
        get_filename_component(d ${root}/${h} DIRECTORY)
        file(MAKE_DIRECTORY ${d})
        file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${h} ${root}/${h} SYMBOLIC)
      endif()
    endforeach()
  endforeach()
  target_include_directories(${target} ${scope} ${root})
endfunction()

# The tests' own helpers (tests/unit/loader/test_support.h, tests/fuzz/fuzz_support.h ...): every
# test program may include them; nothing outside tests/ can.
function(ibvx_test_surface target)
  set(root ${PROJECT_BINARY_DIR}/surfaces/tests)
  if(NOT IS_SYMLINK ${root}/tests)
    file(MAKE_DIRECTORY ${root})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/tests ${root}/tests SYMBOLIC)
  endif()
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include ${root})
endfunction()

# ibvx_library(NAME [STATIC|SHARED|MODULE] SOURCES ... [LIBS ...] [INCLUDES ...] [SURFACE DIR...]):
# SURFACE names the module folders whose headers the library exposes (default: the folder of the
# calling CMakeLists.txt).
function(ibvx_library name)
  cmake_parse_arguments(A "STATIC;SHARED;MODULE" "" "SOURCES;LIBS;INCLUDES;SURFACE" ${ARGN})
  set(kind STATIC)
  if(A_SHARED)
    set(kind SHARED)
  elseif(A_MODULE)
    set(kind MODULE)
  endif()
  if(NOT A_SURFACE)
    file(RELATIVE_PATH A_SURFACE ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  endif()
  add_library(${name} ${kind} ${A_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include ${A_INCLUDES})
  ibvx_surface(${name} PUBLIC ${A_SURFACE})
  target_link_libraries(${name} PUBLIC ${A_LIBS})
  ibvx_warnings(${name})
endfunction()

# The RUNPATH of an installed program that links libibv_extend.so: programs go to <prefix>/bin,
# the library to <prefix>/lib, so relative to the program it holds for any install prefix and
# needs neither LD_LIBRARY_PATH nor ldconfig.
set(IBVX_PROGRAM_INSTALL_RPATH "\$ORIGIN/../lib")

# ibvx_provider(NAME SOURCES ... [LIBS ...]): an extension driver lib<NAME>.so, placed in the
# build tree's provider dir so tests and the demo load it exactly as an installed one.
function(ibvx_provider name)
  cmake_parse_arguments(A "" "" "SOURCES;LIBS" ${ARGN})
  add_library(${name} SHARED ${A_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${name} PRIVATE ${A_LIBS})
  set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/providers-out)
  ibvx_warnings(${name})
  install(TARGETS ${name} LIBRARY DESTINATION ${IBVX_PROVIDER_INSTALL_DIR})
endfunction()

# ibvx_test_library(NAME SOURCES ... [LIBS ...]): code several test programs share (a broker
# process, a test client), compiled once rather than into each program that uses it.
function(ibvx_test_library name)
  cmake_parse_arguments(A "" "" "SOURCES;LIBS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  ibvx_test_surface(${name})
  target_link_libraries(${name} PUBLIC ${A_LIBS})
  ibvx_warnings(${name})
endfunction()

# The labels of tests this build never runs (the Makefile's ctest selections): the ASan suite
# leaves out no-asan; the cross build's suite under qemu-user leaves out no-qemu, and needs-binfmt
# when the kernel has no binfmt_misc handler for aarch64 (cmake/toolchain-aarch64.cmake).
set(IBVX_UNRUN_LABELS "")
if(IBVX_ASAN)
  list(APPEND IBVX_UNRUN_LABELS no-asan)
endif()
if(CMAKE_CROSSCOMPILING)
  list(APPEND IBVX_UNRUN_LABELS no-qemu)
  if(NOT IBVX_BINFMT_AARCH64)
    list(APPEND IBVX_UNRUN_LABELS needs-binfmt)
  endif()
endif()

# ibvx_test(NAME SOURCES ... [LIBS ...] [LABELS ...]): a GoogleTest binary, every test a ctest.
#
# A binary whose LABELS include one of IBVX_UNRUN_LABELS is left out of the default build
# (EXCLUDE_FROM_ALL; `cmake --build <dir> --target NAME` still builds it): compiling it would cost
# minutes of CI for tests nobody runs there (tests/integration/verbs/ucx_test.cpp alone was 65 s
# of the ASan build). ctest then lists it as the single test NAME_NOT_BUILT carrying the same
# labels, so the build's suite (-LE no-asan ...) leaves it out exactly as before and the
# Makefile's lists of what is not run still name it.
include(GoogleTest)
function(ibvx_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  set(_unrun OFF)
  foreach(_label ${A_LABELS})
    if(_label IN_LIST IBVX_UNRUN_LABELS)
      set(_unrun ON)
    endif()
  endforeach()
  if(_unrun)
    set_target_properties(${name} PROPERTIES EXCLUDE_FROM_ALL TRUE)
  endif()
  ibvx_test_surface(${name})
  target_link_libraries(${name} PRIVATE ${A_LIBS} GTest::gtest GTest::gtest_main GTest::gmock Threads::Threads)
  ibvx_warnings(${name})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  # The environment goes through `cmake -E env` as the test launcher: gtest_discover_tests
  # re-splits list-valued properties, so a multi-variable ENVIRONMENT property does not survive.
  # A cross build's emulator (cmake/toolchain-aarch64.cmake) comes after the environment.
  set(_launcher "${CMAKE_COMMAND};-E;env;IBV_EXTEND_PROVIDER_DIR=${PROJECT_BINARY_DIR}/providers-out;IBVX_BUILD_DIR=${PROJECT_BINARY_DIR};IBVX_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  list(APPEND _launcher ${CMAKE_CROSSCOMPILING_EMULATOR})
  set_target_properties(${name} PROPERTIES CROSSCOMPILING_EMULATOR "${_launcher}")
  # The TSan build compiles only what its suite (label tsan) runs: see ibvx_tsan_tests.
  if("tsan" IN_LIST A_LABELS)
    set_property(GLOBAL APPEND PROPERTY IBVX_TSAN_TESTS ${name})
  endif()
  # An empty LABELS value would shift the property list.
  if(A_LABELS)
    gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST PROPERTIES TIMEOUT ${A_TIMEOUT} LABELS "${A_LABELS}")
  else()
    gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST PROPERTIES TIMEOUT ${A_TIMEOUT})
  endif()
  # gtest_discover_tests re-splits list-valued properties, so of several LABELS only the first
  # would reach ctest: a script ctest includes after the discovery sets them all on the tests it
  # listed (<name>_TESTS), or, for a binary this build leaves out, on its NAME_NOT_BUILT.
  list(LENGTH A_LABELS _labels)
  if(_labels GREATER 1 OR _unrun)
    set(_script "${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake")
    set(_body "if(DEFINED ${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${A_LABELS}\")\n")
    if(_unrun)
      string(APPEND _body "else()\n  set_tests_properties(${name}_NOT_BUILT PROPERTIES LABELS \"${A_LABELS}\")\n")
    endif()
    file(WRITE "${_script}" "${_body}endif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${_script}")
  endif()
endfunction()
