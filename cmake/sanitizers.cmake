# Host sanitizer and fuzzer builds (CPU only). Included by the top-level CMakeLists.txt before
# any target exists, so the flags reach the library, the CLI, the tests and the fuzzers alike.
#
#   EVOATTN_SANITIZE=ON       AddressSanitizer + UndefinedBehaviorSanitizer; the first report
#                             aborts the process (-fno-sanitize-recover), so a test that
#                             triggers one fails.
#   EVOATTN_BUILD_FUZZERS=ON  the same, plus libFuzzer coverage on everything and the targets
#                             in fuzz/ (clang only). docs/FUZZING.md says how to run them.
include_guard(GLOBAL)

option(EVOATTN_SANITIZE "Build everything with AddressSanitizer and UBSan (CPU only)" OFF)
option(EVOATTN_BUILD_FUZZERS "Build the libFuzzer targets in fuzz/ (clang; implies the sanitizers)" OFF)

if(NOT EVOATTN_SANITIZE AND NOT EVOATTN_BUILD_FUZZERS)
  return()
endif()

# nvcc takes none of these flags and the CUDA runtime does not run under ASan's defaults.
if(EVOATTN_CUDA STREQUAL "ON")
  message(FATAL_ERROR "EVOATTN_SANITIZE / EVOATTN_BUILD_FUZZERS cover the CPU build only: "
                      "configure with -DEVOATTN_CUDA=OFF")
endif()
set(EVOATTN_CUDA "OFF")  # AUTO: this configure only, the cached choice stays
if(EVOATTN_BUILD_PYTHON)
  message(FATAL_ERROR "EVOATTN_SANITIZE / EVOATTN_BUILD_FUZZERS do not build the Python module "
                      "(an instrumented extension needs the ASan runtime preloaded into Python)")
endif()

if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang|GNU")
  message(FATAL_ERROR "EVOATTN_SANITIZE needs clang or gcc, got ${CMAKE_CXX_COMPILER_ID}")
endif()
if(EVOATTN_BUILD_FUZZERS AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "EVOATTN_BUILD_FUZZERS needs clang (libFuzzer ships with it), got "
                      "${CMAKE_CXX_COMPILER_ID}: configure with CC=clang-14 CXX=clang++-14 "
                      "(Debian: apt-get install clang-14 libclang-rt-14-dev)")
endif()

set(EVOATTN_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all
    -fno-omit-frame-pointer -g)
add_compile_options(${EVOATTN_SANITIZER_FLAGS})
add_link_options(-fsanitize=address,undefined)
if(EVOATTN_BUILD_FUZZERS)
  # Coverage for libFuzzer in every object; only the fuzz targets link its main().
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
list(JOIN EVOATTN_SANITIZER_FLAGS " " flags)
message(STATUS "evoattn: sanitizers ON (${flags}), fuzzers ${EVOATTN_BUILD_FUZZERS}")
