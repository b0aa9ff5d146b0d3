#include "deepinfer/core/thread_pool.h"

#include <algorithm>

namespace deepinfer {

ThreadPool::ThreadPool(int num_threads) {
  int n = num_threads > 0 ? num_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

static void chunk_range(int64_t n, int parts, int index, int64_t* b, int64_t* e) {
  int64_t base = n / parts, rem = n % parts;
  *b = index * base + std::min<int64_t>(index, rem);
  *e = *b + base + (index < rem ? 1 : 0);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
    }
    int64_t b, e;
    chunk_range(n, size(), index, &b, &e);
    std::exception_ptr err;
    if (b < e) {
      try {
        (*job)(b, e);
      } catch (...) {
        err = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  work_cv_.notify_all();
  int64_t b, e;
  chunk_range(n, size(), 0, &b, &e);
  std::exception_ptr err;
  try {
    if (b < e) fn(b, e);
  } catch (...) {
    err = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  if (!err) err = error_;
  job_ = nullptr;
  if (err) std::rethrow_exception(err);
}

}  // namespace deepinfer
