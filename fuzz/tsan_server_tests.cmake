# ThreadSanitizer build of the HTTP server's tests (`./build.sh tsan`; docs/RELIABILITY.md has its results). In the
# clang project of fuzz/ for ccache and dependency tracking, but nothing is shared with the ASan objects: TSan needs
# every instrumented object built for it. The server tests load a real model (the golden V4.1 checkpoint) through
# ModelHost, so the whole library but cli/, bench/ and ops/cuda is compiled: model, ops, kv, sampling and tokenizer
# (the forward and the samplers: the hot loops) at -O1, the rest at -O0 (Boost.Beast and the engine are the most
# expensive files to build). Tests: tests/server/*_test.cc (HTTP server, engine service, disconnects, security),
# tests/engine/{engine,scheduler}_test.cc (the asynchronous step executor, as tools/tsan_engine_tests.sh), and the
# multi-rank threads: tests/parallel/*_test.cc (the in-process Communicator, EP / DP / CP runners with one thread per
# rank, the TCP bootstrap) and tests/engine/context_parallel_runner_test.cc.
find_package(GTest REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(Threads REQUIRED)

set(TSAN_FLAGS -fsanitize=thread -fno-omit-frame-pointer -gline-tables-only)

file(GLOB_RECURSE TSAN_LIB_SOURCES CONFIGURE_DEPENDS ${SRC}/deepinfer/*.cc)
list(FILTER TSAN_LIB_SOURCES EXCLUDE REGEX "/src/deepinfer/(cli|bench|ops/cuda)/")
add_library(tsan_deepinfer STATIC EXCLUDE_FROM_ALL ${TSAN_LIB_SOURCES})
# -O1 here; sanitized_tests.cmake's per-source COMPILE_OPTIONS (directory-wide, they come after the target's) turn
# engine, server, parallel, spec, api and core down to -O0, as in the ASan build. Its -fno-sanitize=function on
# http_server.cc is a no-op here.
target_compile_options(tsan_deepinfer PRIVATE ${TSAN_FLAGS} -O1)
target_include_directories(tsan_deepinfer PUBLIC ${SRC})
target_compile_definitions(tsan_deepinfer PUBLIC DEEPINFER_SOURCE_DIR="${DEEPINFER_ROOT}" BOOST_ASIO_HAS_CO_AWAIT=1)
target_link_libraries(tsan_deepinfer PUBLIC nlohmann_json::nlohmann_json fmt::fmt spdlog::spdlog PkgConfig::PCRE2
  ICU::uc Boost::headers Threads::Threads)
target_link_options(tsan_deepinfer PUBLIC -fsanitize=thread)

file(GLOB TSAN_TEST_SOURCES CONFIGURE_DEPENDS ${DEEPINFER_ROOT}/tests/server/*_test.cc
  ${DEEPINFER_ROOT}/tests/parallel/*_test.cc)
add_executable(tsan_server_tests EXCLUDE_FROM_ALL ${TSAN_TEST_SOURCES} ${DEEPINFER_ROOT}/tests/engine/engine_test.cc
  ${DEEPINFER_ROOT}/tests/engine/scheduler_test.cc ${DEEPINFER_ROOT}/tests/engine/context_parallel_runner_test.cc
  ${DEEPINFER_ROOT}/tests/test_util.cc
  ${DEEPINFER_ROOT}/tests/server/server_test_util.cc)
target_include_directories(tsan_server_tests PRIVATE ${DEEPINFER_ROOT}/tests)
target_compile_options(tsan_server_tests PRIVATE -O0 ${TSAN_FLAGS})
target_link_libraries(tsan_server_tests PRIVATE tsan_deepinfer GTest::gtest GTest::gtest_main)
target_compile_definitions(tsan_server_tests PRIVATE
  DEEPINFER_TEST_DATA_DIR="${DEEPINFER_ROOT}/tests/data"
  DEEPINFER_SHARED_DIR="${DEEPINFER_ROOT}/../shared")  # DEEPINFER_CLI_PATH: on test_util.cc (sanitized_tests.cmake)

# `deepinfer` itself under TSan (`./build.sh tsan-serve`: the soak's mixed requests, aborts and the SIGTERM drain
# against `deepinfer serve`, tools/soak_server.py). The CLI sources and bench/ (the CLI's bench commands; the TSan
# library leaves it out) at -O0 over tsan_deepinfer; the binary is deepinfer_tsan in this build directory.
find_package(CLI11 REQUIRED)
file(GLOB TSAN_CLI_SOURCES CONFIGURE_DEPENDS ${SRC}/deepinfer/cli/*.cc ${SRC}/deepinfer/bench/*.cc)
add_executable(tsan_deepinfer_cli EXCLUDE_FROM_ALL ${TSAN_CLI_SOURCES})
set_target_properties(tsan_deepinfer_cli PROPERTIES OUTPUT_NAME deepinfer_tsan)
target_compile_options(tsan_deepinfer_cli PRIVATE -O0 ${TSAN_FLAGS})
target_link_libraries(tsan_deepinfer_cli PRIVATE tsan_deepinfer CLI11::CLI11)
