#!/bin/bash
# ThreadSanitizer run of the engine's threading tests (asynchronous scheduling: the StepExecutor's worker thread).
# Builds engine, kv, sampling, structured and core sources plus tests/engine/{engine,scheduler}_test.cc directly
# with -fsanitize=thread into build-tsan/engine_tsan_tests (a full TSan build of the project would take far
# longer on a small machine) and runs Engine*:ModelRunner*:Sched*. Exit status 1 on a failed test or any report.
#   tools/tsan_engine_tests.sh   # objects newer than their .cc are reused: remove build-tsan after header changes
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/build-tsan"
mkdir -p "$out"
cd "$out"
flags="-std=c++20 -O1 -g -fsanitize=thread -ffunction-sections -fdata-sections -DSPDLOG_FMT_EXTERNAL -I$root/src -I$root/tests"
srcs="engine/engine.cc engine/scheduler.cc engine/sequence.cc engine/stop_checker.cc engine/step_executor.cc
      engine/model_runner.cc engine/greedy_argmax.cc engine/structured_output.cc engine/scheduling_policy.cc kv/block_allocator.cc kv/kv_cache_manager.cc
      kv/prefix_cache.cc core/error.cc core/logging.cc core/thread_pool.cc spec/verifier.cc spec/dspark_policy.cc"
for f in "$root"/src/deepinfer/sampling/*.cc "$root"/src/deepinfer/structured/*.cc; do
  srcs="$srcs ${f#"$root"/src/deepinfer/}"
done
: > cmds.txt
for f in $srcs; do
  o="$(echo "$f" | tr / _).o"
  [ "$o" -nt "$root/src/deepinfer/$f" ] || echo "g++ $flags -c $root/src/deepinfer/$f -o $o" >> cmds.txt
done
for t in engine_test scheduler_test; do
  [ "t_$t.o" -nt "$root/tests/engine/$t.cc" ] || echo "g++ $flags -c $root/tests/engine/$t.cc -o t_$t.o" >> cmds.txt
done
xargs -P2 -I{} sh -c "{}" < cmds.txt
# --gc-sections drops the tokenizer-facing helper of structured_output.cc that these tests never call.
g++ -fsanitize=thread -Wl,--gc-sections ./*.o -o engine_tsan_tests -lgtest -lgtest_main -lspdlog -lfmt -lpthread
./engine_tsan_tests --gtest_filter='Engine*:ModelRunner*:Sched*' 2>&1 | tee tsan_run.log
! grep -q "WARNING: ThreadSanitizer" tsan_run.log
