# GoogleTest for the test suite and the CLI's tests: an installed package if there is one
# (CONFIG first, then CMake's FindGTest module), else the Debian/Ubuntu source tree.
# Either way the targets GTest::gtest and GTest::gtest_main exist afterwards.
include_guard(GLOBAL)

find_package(GTest CONFIG QUIET)
if(NOT GTest_FOUND)
  find_package(GTest QUIET)
endif()
if(NOT GTest_FOUND AND NOT GTEST_FOUND)
  if(EXISTS /usr/src/googletest/CMakeLists.txt)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    add_subdirectory(/usr/src/googletest ${CMAKE_BINARY_DIR}/_deps/googletest EXCLUDE_FROM_ALL)
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  else()
    message(FATAL_ERROR "GoogleTest not found: install libgtest-dev (or GoogleTest's CMake "
                        "package), or configure with -DEVOATTN_BUILD_TESTS=OFF")
  endif()
endif()
# Imported targets are visible only in the directory that found them, and the guard above
# lets only the first test directory look: make them global so every test directory sees them.
foreach(target GTest::gtest GTest::gtest_main)
  get_target_property(imported ${target} IMPORTED)
  if(imported)
    set_target_properties(${target} PROPERTIES IMPORTED_GLOBAL TRUE)
  endif()
endforeach()
