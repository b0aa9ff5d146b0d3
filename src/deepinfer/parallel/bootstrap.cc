#include "deepinfer/parallel/bootstrap.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "deepinfer/core/error.h"

namespace deepinfer {
namespace {

int parse_int(const EnvLookup& env, const std::string& name, int lo, int hi) {
  const std::optional<std::string> v = env(name);
  DI_CHECK(v.has_value()) << name << " is not set";
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v->c_str(), &end, 10);
  DI_CHECK(!v->empty() && *end == '\0' && errno == 0) << name << "='" << *v << "' is not an integer";
  DI_CHECK(x >= lo && x <= hi) << name << "=" << x << " is outside [" << lo << ", " << hi << "]";
  return static_cast<int>(x);
}

// RAII socket.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
};

double seconds_left(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
}

void wait_io(int fd, short events, std::chrono::steady_clock::time_point deadline, const char* what) {
  pollfd p{fd, events, 0};
  const int ms = static_cast<int>(std::max(0.0, seconds_left(deadline)) * 1000);
  const int r = ::poll(&p, 1, ms);
  DI_CHECK_CODE(r > 0, ErrorCode::kInternal) << "rendezvous: timed out waiting to " << what;
}

void send_all(int fd, const void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    wait_io(fd, POLLOUT, deadline, "send");
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    DI_CHECK_CODE(k > 0, ErrorCode::kInternal) << "rendezvous: send failed: " << std::strerror(errno);
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    wait_io(fd, POLLIN, deadline, "receive");
    const ssize_t k = ::recv(fd, p, n, 0);
    DI_CHECK_CODE(k > 0, ErrorCode::kInternal) << "rendezvous: connection closed after a short read";
    p += k;
    n -= static_cast<size_t>(k);
  }
}

}  // namespace

LaunchEnv launch_env_from(const EnvLookup& env) {
  LaunchEnv e;
  constexpr int kMax = 1 << 20;
  if (env("RANK") || env("WORLD_SIZE")) {
    e.launcher = "torchrun";
    e.world_size = parse_int(env, "WORLD_SIZE", 1, kMax);
    e.rank = parse_int(env, "RANK", 0, e.world_size - 1);
    e.local_rank = env("LOCAL_RANK") ? parse_int(env, "LOCAL_RANK", 0, e.world_size - 1) : e.rank;
    e.local_world_size = env("LOCAL_WORLD_SIZE") ? parse_int(env, "LOCAL_WORLD_SIZE", 1, e.world_size) : e.world_size;
    if (e.world_size > 1) {
      DI_CHECK(env("MASTER_ADDR").has_value() && env("MASTER_PORT").has_value())
          << "torchrun-style launch (RANK/WORLD_SIZE set) needs MASTER_ADDR and MASTER_PORT";
    }
  } else if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = "mpirun";
    e.world_size = parse_int(env, "OMPI_COMM_WORLD_SIZE", 1, kMax);
    e.rank = parse_int(env, "OMPI_COMM_WORLD_RANK", 0, e.world_size - 1);
    e.local_rank =
        env("OMPI_COMM_WORLD_LOCAL_RANK") ? parse_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, e.world_size - 1) : e.rank;
    e.local_world_size = env("OMPI_COMM_WORLD_LOCAL_SIZE")
                             ? parse_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, e.world_size)
                             : e.world_size;
  }
  DI_CHECK(e.local_rank < e.local_world_size)
      << "local rank " << e.local_rank << " is not below the local world size " << e.local_world_size;
  if (auto a = env("MASTER_ADDR")) {
    DI_CHECK(!a->empty()) << "MASTER_ADDR is empty";
    e.master_addr = *a;
  }
  if (env("MASTER_PORT")) e.master_port = parse_int(env, "MASTER_PORT", 1, 65535);
  return e;
}

LaunchEnv launch_env_from_process() {
  return launch_env_from([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  });
}

void validate_launch(const LaunchEnv& env, const ParallelLayout& layout, int visible_devices) {
  DI_CHECK(env.world_size == layout.world)
      << "the launcher started " << env.world_size << " process(es) (" << env.launcher << ") but the layout needs "
      << layout.world << " (" << layout.str() << ")";
  DI_CHECK_CODE(visible_devices > 0, ErrorCode::kNotFound)
      << "rank " << env.rank << ": no GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
  DI_CHECK_CODE(env.local_rank < visible_devices, ErrorCode::kNotFound)
      << "rank " << env.rank << " (local rank " << env.local_rank << ") needs GPU " << env.local_rank << " but "
      << visible_devices << " GPU(s) are visible (CUDA_VISIBLE_DEVICES); " << env.local_world_size
      << " processes on this node need as many GPUs";
}

std::vector<uint8_t> tcp_share_blob(const LaunchEnv& env, const std::vector<uint8_t>& blob, double timeout_s) {
  if (env.world_size == 1) return blob;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  if (env.rank == 0) {
    Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
    DI_CHECK_CODE(listener.fd >= 0, ErrorCode::kInternal) << "rendezvous: socket: " << std::strerror(errno);
    const int one = 1;
    ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(env.master_port));
    DI_CHECK_CODE(::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, ErrorCode::kInternal)
        << "rendezvous: rank 0 cannot listen on port " << env.master_port << " (MASTER_PORT): " << std::strerror(errno);
    DI_CHECK_CODE(::listen(listener.fd, env.world_size) == 0, ErrorCode::kInternal)
        << "rendezvous: listen: " << std::strerror(errno);
    const uint64_t size = blob.size();
    for (int joined = 1; joined < env.world_size; ++joined) {
      wait_io(listener.fd, POLLIN, deadline,
              ("accept rank connections (" + std::to_string(joined - 1) + " of " + std::to_string(env.world_size - 1) +
               " joined)")
                  .c_str());
      Fd c(::accept(listener.fd, nullptr, nullptr));
      DI_CHECK_CODE(c.fd >= 0, ErrorCode::kInternal) << "rendezvous: accept: " << std::strerror(errno);
      int32_t peer = -1;
      recv_all(c.fd, &peer, sizeof(peer), deadline);
      DI_CHECK_CODE(peer > 0 && peer < env.world_size, ErrorCode::kInternal)
          << "rendezvous: a peer announced rank " << peer << " in a world of " << env.world_size;
      send_all(c.fd, &size, sizeof(size), deadline);
      send_all(c.fd, blob.data(), blob.size(), deadline);
    }
    return blob;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(env.master_port);
  const int gai = ::getaddrinfo(env.master_addr.c_str(), port.c_str(), &hints, &res);
  DI_CHECK_CODE(gai == 0 && res != nullptr, ErrorCode::kNotFound)
      << "rendezvous: cannot resolve MASTER_ADDR '" << env.master_addr << "': " << ::gai_strerror(gai);
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> hold(res, ::freeaddrinfo);
  // Rank 0 may not listen yet: retry until the deadline.
  while (true) {
    Fd s(::socket(AF_INET, SOCK_STREAM, 0));
    DI_CHECK_CODE(s.fd >= 0, ErrorCode::kInternal) << "rendezvous: socket: " << std::strerror(errno);
    if (::connect(s.fd, res->ai_addr, res->ai_addrlen) == 0) {
      const int32_t me = env.rank;
      send_all(s.fd, &me, sizeof(me), deadline);
      uint64_t size = 0;
      recv_all(s.fd, &size, sizeof(size), deadline);
      DI_CHECK_CODE(size < (uint64_t{1} << 20), ErrorCode::kInternal) << "rendezvous: implausible blob size " << size;
      std::vector<uint8_t> out(size);
      recv_all(s.fd, out.data(), out.size(), deadline);
      return out;
    }
    DI_CHECK_CODE(seconds_left(deadline) > 0, ErrorCode::kInternal)
        << "rendezvous: rank " << env.rank << " could not reach rank 0 at " << env.master_addr << ":" << env.master_port
        << " (MASTER_ADDR:MASTER_PORT) within " << timeout_s << " s";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace deepinfer
