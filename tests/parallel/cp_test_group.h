// Test harness for context parallelism: runs one function per rank on its own thread, with an in-process
// equal-size all-gather between them (std::barrier + shared pointers).
#pragma once

#include <barrier>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "deepinfer/parallel/context_parallel.h"

namespace deepinfer::testing {

class CpTestGroup {
 public:
  explicit CpTestGroup(int size) : size_(size), sends_(size), barrier_(size) {}

  AllGatherBytes all_gather(int rank) {
    return [this, rank](const void* send, void* recv, size_t bytes) {
      sends_[rank] = send;
      barrier_.arrive_and_wait();  // every rank's block is posted
      for (int r = 0; r < size_; ++r) std::memcpy(static_cast<char*>(recv) + r * bytes, sends_[r], bytes);
      barrier_.arrive_and_wait();  // nobody frees its block while another rank still reads it
    };
  }

  // Runs fn(rank) on `size` threads; rethrows the first exception. A rank that throws drops out of the barrier so
  // the others finish (with garbage) instead of hanging.
  void run(const std::function<void(int rank)>& fn) {
    std::vector<std::exception_ptr> errors(size_);
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r)
      threads.emplace_back([&, r] {
        try {
          fn(r);
        } catch (...) {
          errors[r] = std::current_exception();
          barrier_.arrive_and_drop();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  int size_;
  std::vector<const void*> sends_;
  std::barrier<> barrier_;
};

}  // namespace deepinfer::testing
