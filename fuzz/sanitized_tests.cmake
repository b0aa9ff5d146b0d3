# ASan+UBSan build of the unit and integration tests (`./build.sh test` runs it with build.sh's SANITIZED_FILTER,
# `./build.sh sanitize` alone; docs/RELIABILITY.md has its cost and coverage). Included by fuzz/CMakeLists.txt so that the ~30 parser, tokenizer and structured
# sources the fuzz targets already compile instrumented are linked as they are, not compiled a second time.
# The rest of the library is compiled here once: model, ops, kv and sampling (the tiny model's forward and the
# samplers: the hot loops) at -O1; engine, server, parallel, spec, api and core at -O0, which halves their compile
# (Boost.Beast and the engine are the most expensive files to build) and costs little at run time; the tests at -O0
# too. Left out, to bound the compile: cli/ and bench/ (their tests drive the uninstrumented CLI), cuda/,
# parallel/ (multi-rank plumbing: threads and processes, more TSan's ground than ASan's) and model/ but for the tiny
# model and the config parser (golden replays and other families' loaders: minutes of model math under ASan).
find_package(GTest REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(Threads REQUIRED)

set(SAN_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
  -gline-tables-only)

file(GLOB_RECURSE SAN_LIB_SOURCES CONFIGURE_DEPENDS ${SRC}/deepinfer/*.cc)
list(FILTER SAN_LIB_SOURCES EXCLUDE REGEX "/src/deepinfer/(cli|bench|ops/cuda)/")
get_target_property(SAN_REUSED_PARSERS fuzz_parsers SOURCES)
get_target_property(SAN_REUSED_TOKENIZER fuzz_tokenizer SOURCES)
list(REMOVE_ITEM SAN_LIB_SOURCES ${SAN_REUSED_PARSERS} ${SAN_REUSED_TOKENIZER})
add_library(san_deepinfer STATIC EXCLUDE_FROM_ALL ${SAN_LIB_SOURCES})
target_compile_options(san_deepinfer PRIVATE ${SAN_FLAGS})
set(SAN_O1_SOURCES ${SAN_LIB_SOURCES})
list(FILTER SAN_O1_SOURCES INCLUDE REGEX "/src/deepinfer/(model|ops|kv|sampling|tokenizer)/")
set(SAN_O0_SOURCES ${SAN_LIB_SOURCES})
list(REMOVE_ITEM SAN_O0_SOURCES ${SAN_O1_SOURCES})
set_source_files_properties(${SAN_O1_SOURCES} PROPERTIES COMPILE_OPTIONS -O1)
set_source_files_properties(${SAN_O0_SOURCES} PROPERTIES COMPILE_OPTIONS -O0)
# clang 14's -fsanitize=function cannot emit its prologue data for split coroutine functions ("Cannot represent a
# difference across sections"); the server's coroutines are the only ones, so only that file goes without it.
set_source_files_properties(${SRC}/deepinfer/server/http_server.cc PROPERTIES COMPILE_OPTIONS "-O0;-fno-sanitize=function")
target_compile_definitions(san_deepinfer PUBLIC DEEPINFER_SOURCE_DIR="${DEEPINFER_ROOT}")
target_link_libraries(san_deepinfer PUBLIC fuzz_tokenizer Boost::headers Threads::Threads)
# Boost 1.74 enables co_await for clang only with libc++'s <experimental/coroutine>; clang >= 14 has the C++20
# coroutines of libstdc++'s <coroutine>, which Asio then uses (BOOST_ASIO_HAS_STD_COROUTINE follows on its own).
target_compile_definitions(san_deepinfer PUBLIC BOOST_ASIO_HAS_CO_AWAIT=1)

file(GLOB_RECURSE SAN_TEST_SOURCES CONFIGURE_DEPENDS ${DEEPINFER_ROOT}/tests/*_test.cc)
list(FILTER SAN_TEST_SOURCES EXCLUDE REGEX
  "/tests/(cli|bench|cuda|parallel|model)/")
list(APPEND SAN_TEST_SOURCES ${DEEPINFER_ROOT}/tests/model/tiny_model_test.cc ${DEEPINFER_ROOT}/tests/model/model_config_test.cc)
add_executable(sanitized_tests EXCLUDE_FROM_ALL ${SAN_TEST_SOURCES} ${DEEPINFER_ROOT}/tests/test_util.cc
  ${DEEPINFER_ROOT}/tests/server/server_test_util.cc)
target_include_directories(sanitized_tests PRIVATE ${DEEPINFER_ROOT}/tests)
target_compile_options(sanitized_tests PRIVATE -O0 ${SAN_FLAGS})
target_link_options(sanitized_tests PRIVATE -fsanitize=address,undefined)
target_link_libraries(sanitized_tests PRIVATE san_deepinfer GTest::gtest GTest::gtest_main)
# gtest, nlohmann/json and the standard headers the test files share, parsed and their templates instantiated once
# (CMake passes clang -fpch-instantiate-templates): at -O0 the front end and the instantiations are most of a test
# file's compile, and the precompiled header halves it for the small ones (docs/RELIABILITY.md, "CI cost").
target_precompile_headers(sanitized_tests PRIVATE <gtest/gtest.h> <nlohmann/json.hpp> <fmt/format.h> <algorithm>
  <cmath> <cstring> <functional> <map> <memory> <numeric> <random> <regex> <string> <vector>)
target_compile_definitions(sanitized_tests PRIVATE
  DEEPINFER_TEST_DATA_DIR="${DEEPINFER_ROOT}/tests/data"
  DEEPINFER_SHARED_DIR="${DEEPINFER_ROOT}/../shared")
# A test that runs the CLI runs the main build's (uninstrumented) binary. On test_util.cc only, so that another
# path recompiles one file.
set(DEEPINFER_CLI "${DEEPINFER_ROOT}/build/bin/deepinfer" CACHE FILEPATH "the deepinfer CLI the tests may run")
set_source_files_properties(${DEEPINFER_ROOT}/tests/test_util.cc PROPERTIES
  COMPILE_DEFINITIONS DEEPINFER_CLI_PATH="${DEEPINFER_CLI}")
