// A collective is three phases on a group's shared board: every rank posts its arguments and waits at a barrier;
// every rank then reads the posts (and the peers' send buffers) and writes only its own output; a second barrier
// keeps every send buffer alive until all peers have read it. In-place reductions compute into a private buffer
// and copy after the second barrier.
#include "deepinfer/parallel/in_process_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

enum class OpKind { kAllReduce, kAllGather, kAllToAllV, kBroadcast, kBarrier, kSplit };

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kAllToAllV:
      return "all_to_all_v";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kSplit:
      return "split";
  }
  return "?";
}

// Thrown into the surviving ranks when a peer failed; run() prefers the peer's own exception.
struct PeerFailed : Error {
  PeerFailed() : Error(ErrorCode::kInternal, "in-process communicator: another rank failed") {}
};

struct Group;

struct Post {
  OpKind kind = OpKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  const int64_t* send_counts = nullptr;
  int64_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  int color = 0, key = 0;
  std::shared_ptr<Group> made;  // split: the group a leader created for its color
};

struct Group {
  Group(int n, std::shared_ptr<std::atomic<bool>> failed) : posts(n), failed(std::move(failed)) {}
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<Post> posts;
  std::shared_ptr<std::atomic<bool>> failed;  // world-wide

  void barrier() {
    std::unique_lock<std::mutex> lock(mu);
    const uint64_t gen = generation;
    if (++arrived == static_cast<int>(posts.size())) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    // Poll the failure flag: a failed rank never arrives, and it cannot reach every group's condition variable.
    while (generation == gen) {
      if (failed->load()) throw PeerFailed();
      cv.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
};

double load_value(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kI32:
      return static_cast<const int32_t*>(p)[i];
    default:
      break;
  }
  DI_FAIL(ErrorCode::kUnsupported) << "all_reduce: dtype " << dtype_name(t) << " (f32, bf16, i32, i64 are)";
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->posts.size()); }
  bool accepts(Device device) const override { return device.kind == DeviceKind::kCPU; }
  std::string name() const override { return "in-process"; }

  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    Post p = base(OpKind::kAllReduce, count, dtype);
    p.send = data;
    p.op = op;
    start(p);
    const int n = size();
    const int64_t bytes = count * comm_element_bytes(dtype);
    std::vector<unsigned char> result(bytes);
    if (dtype == DType::kI64) {
      // Exact in 64-bit integers (a double would lose counts above 2^53).
      auto* out = reinterpret_cast<int64_t*>(result.data());
      for (int64_t i = 0; i < count; ++i) {
        int64_t acc = static_cast<const int64_t*>(group_->posts[0].send)[i];
        for (int r = 1; r < n; ++r) acc = combine(acc, static_cast<const int64_t*>(group_->posts[r].send)[i], op);
        out[i] = acc;
      }
    } else {
      for (int64_t i = 0; i < count; ++i) {
        // f32 sums accumulate in f32 in rank order (what a ring of one chunk does); bf16 in f32, rounded once.
        if (dtype == DType::kF32 || dtype == DType::kBF16) {
          float acc = static_cast<float>(load_value(group_->posts[0].send, dtype, i));
          for (int r = 1; r < n; ++r)
            acc = combine(acc, static_cast<float>(load_value(group_->posts[r].send, dtype, i)), op);
          if (dtype == DType::kF32) {
            reinterpret_cast<float*>(result.data())[i] = acc;
          } else {
            reinterpret_cast<uint16_t*>(result.data())[i] = f32_to_bf16(acc);
          }
        } else {
          int32_t acc = static_cast<int32_t>(load_value(group_->posts[0].send, dtype, i));
          for (int r = 1; r < n; ++r)
            acc = combine(acc, static_cast<int32_t>(load_value(group_->posts[r].send, dtype, i)), op);
          reinterpret_cast<int32_t*>(result.data())[i] = acc;
        }
      }
    }
    group_->barrier();
    if (bytes > 0) std::memcpy(data, result.data(), bytes);
  }

  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    Post p = base(OpKind::kAllGather, count, dtype);
    p.send = send;
    start(p);
    const int64_t bytes = count * comm_element_bytes(dtype);
    for (int r = 0; r < size(); ++r) {
      if (bytes > 0) std::memmove(static_cast<unsigned char*>(recv) + r * bytes, group_->posts[r].send, bytes);
    }
    group_->barrier();
  }

  void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                    std::span<const int64_t> recv_counts, DType dtype) override {
    const int n = size();
    DI_CHECK(static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n)
        << "all_to_all_v: " << send_counts.size() << " send and " << recv_counts.size() << " recv counts for " << n
        << " ranks";
    Post p = base(OpKind::kAllToAllV, 0, dtype);
    p.send = send;
    p.send_counts = send_counts.data();
    start(p);
    const int64_t esize = comm_element_bytes(dtype);
    int64_t recv_offset = 0;
    for (int r = 0; r < n; ++r) {
      const Post& peer = group_->posts[r];
      int64_t send_offset = 0;
      for (int q = 0; q < rank_; ++q) send_offset += peer.send_counts[q];
      const int64_t c = peer.send_counts[rank_];
      if (c != recv_counts[r]) {
        group_->barrier();  // keep the peers in step; they throw from their own check or the next collective
        DI_FAIL(ErrorCode::kInternal) << "all_to_all_v: rank " << rank_ << " expects " << recv_counts[r]
                                      << " elements from rank " << r << ", which sends " << c;
      }
      if (c > 0)
        std::memcpy(static_cast<unsigned char*>(recv) + recv_offset * esize,
                    static_cast<const unsigned char*>(peer.send) + send_offset * esize, c * esize);
      recv_offset += c;
    }
    group_->barrier();
  }

  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    DI_CHECK(root >= 0 && root < size()) << "broadcast: root " << root << " outside [0, " << size() << ")";
    Post p = base(OpKind::kBroadcast, count, dtype);
    p.send = data;
    p.root = root;
    start(p);
    if (rank_ != root && count > 0) std::memcpy(data, group_->posts[root].send, count * comm_element_bytes(dtype));
    group_->barrier();
  }

  void barrier() override { start(base(OpKind::kBarrier, 0, DType::kU8)); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    Post p = base(OpKind::kSplit, 0, DType::kU8);
    p.color = color;
    p.key = key;
    start(p);
    std::vector<int> members;  // old ranks of my color, ordered by (key, old rank)
    for (int r = 0; r < size(); ++r)
      if (group_->posts[r].color == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return group_->posts[a].key < group_->posts[b].key; });
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    if (new_rank == 0)
      group_->posts[rank_].made = std::make_shared<Group>(static_cast<int>(members.size()), group_->failed);
    group_->barrier();
    std::shared_ptr<Group> g = group_->posts[members[0]].made;
    group_->barrier();  // everyone holds its group before the leader's post is reused
    group_->posts[rank_].made.reset();
    return std::make_unique<InProcessCommunicator>(std::move(g), new_rank);
  }

 private:
  template <typename T>
  static T combine(T a, T b, ReduceOp op) {
    switch (op) {
      case ReduceOp::kSum:
        return a + b;
      case ReduceOp::kMax:
        return std::max(a, b);
      case ReduceOp::kMin:
        return std::min(a, b);
    }
    return a;
  }

  static Post base(OpKind kind, int64_t count, DType dtype) {
    Post p;
    p.kind = kind;
    p.count = count;
    p.dtype = dtype;
    return p;
  }

  // Posts the arguments, waits for all ranks, and checks that they called the same collective.
  void start(const Post& p) {
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      std::shared_ptr<Group> keep = std::move(group_->posts[rank_].made);
      group_->posts[rank_] = p;
      group_->posts[rank_].made = std::move(keep);
    }
    group_->barrier();
    for (int r = 0; r < size(); ++r) {
      const Post& q = group_->posts[r];
      const bool same = q.kind == p.kind && q.dtype == p.dtype &&
                        (p.kind == OpKind::kAllToAllV || p.kind == OpKind::kSplit || q.count == p.count) &&
                        (p.kind != OpKind::kBroadcast || q.root == p.root);
      if (!same) {
        std::ostringstream s;
        s << "collective mismatch: rank " << rank_ << " called " << op_name(p.kind) << "(" << p.count << " x "
          << dtype_name(p.dtype) << ") while rank " << r << " called " << op_name(q.kind) << "(" << q.count << " x "
          << dtype_name(q.dtype) << ")";
        DI_FAIL(ErrorCode::kInternal) << s.str();  // every rank sees the mismatch and throws
      }
    }
  }

  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

struct InProcessWorld::State {
  int n = 0;
  std::shared_ptr<std::atomic<bool>> failed = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<Group> world;
  std::vector<std::unique_ptr<InProcessCommunicator>> comms;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t job = 0;  // generation of the job to run
  int finished = 0;
  bool stop = false, broken = false;
  const std::function<void(Communicator&)>* fn = nullptr;
  std::vector<std::exception_ptr> errors;
  std::vector<char> peer_failed;
};

InProcessWorld::InProcessWorld(int n) : state_(std::make_unique<State>()) {
  DI_CHECK(n >= 1) << "InProcessWorld: world size must be >= 1, got " << n;
  State& st = *state_;
  st.n = n;
  st.world = std::make_shared<Group>(n, st.failed);
  st.errors.resize(n);
  st.peer_failed.assign(n, 0);
  for (int r = 0; r < n; ++r) st.comms.push_back(std::make_unique<InProcessCommunicator>(st.world, r));
  for (int r = 0; r < n; ++r) {
    st.threads.emplace_back([&st, r] {
      uint64_t seen = 0;
      while (true) {
        const std::function<void(Communicator&)>* fn = nullptr;
        {
          std::unique_lock<std::mutex> lock(st.mu);
          st.cv.wait(lock, [&] { return st.stop || st.job != seen; });
          if (st.stop) return;
          seen = st.job;
          fn = st.fn;
        }
        try {
          (*fn)(*st.comms[r]);
        } catch (const PeerFailed&) {
          st.errors[r] = std::current_exception();
          st.peer_failed[r] = 1;
        } catch (...) {
          st.errors[r] = std::current_exception();
          st.failed->store(true);
        }
        std::lock_guard<std::mutex> lock(st.mu);
        ++st.finished;
        st.cv.notify_all();
      }
    });
  }
}

InProcessWorld::~InProcessWorld() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  for (std::thread& t : state_->threads) t.join();
}

int InProcessWorld::size() const { return state_->n; }

void InProcessWorld::run_on_all(const std::function<void(Communicator&)>& fn) {
  State& st = *state_;
  DI_CHECK_CODE(!st.broken, ErrorCode::kInternal) << "in-process world: a rank failed in an earlier job";
  {
    std::unique_lock<std::mutex> lock(st.mu);
    st.fn = &fn;
    st.finished = 0;
    for (int r = 0; r < st.n; ++r) {
      st.errors[r] = nullptr;
      st.peer_failed[r] = 0;
    }
    ++st.job;
    st.cv.notify_all();
    st.cv.wait(lock, [&] { return st.finished == st.n; });
    st.fn = nullptr;
  }
  for (int r = 0; r < st.n; ++r) {
    if (st.errors[r]) st.broken = true;
  }
  for (int r = 0; r < st.n; ++r)
    if (st.errors[r] && !st.peer_failed[r]) std::rethrow_exception(st.errors[r]);
  for (int r = 0; r < st.n; ++r)
    if (st.errors[r]) std::rethrow_exception(st.errors[r]);
}

void InProcessWorld::run(int n, const std::function<void(Communicator&)>& fn) {
  DI_CHECK(n >= 1) << "InProcessWorld::run: world size must be >= 1, got " << n;
  auto failed = std::make_shared<std::atomic<bool>>(false);
  auto world = std::make_shared<Group>(n, failed);
  std::vector<std::exception_ptr> errors(n);
  std::vector<char> peer_failed(n, 0);  // not vector<bool>: ranks write their own entry concurrently
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        InProcessCommunicator comm(world, r);
        fn(comm);
      } catch (const PeerFailed&) {
        errors[r] = std::current_exception();
        peer_failed[r] = 1;
      } catch (...) {
        errors[r] = std::current_exception();
        failed->store(true);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (errors[r] && !peer_failed[r]) std::rethrow_exception(errors[r]);
  for (int r = 0; r < n; ++r)
    if (errors[r]) std::rethrow_exception(errors[r]);
}

}  // namespace deepinfer
