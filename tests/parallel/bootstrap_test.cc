#include "deepinfer/parallel/bootstrap.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <thread>

namespace deepinfer {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& n) -> std::optional<std::string> {
    auto it = vars.find(n);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnv, TorchrunMpirunAndSingle) {
  LaunchEnv t = launch_env_from(env_of({{"RANK", "5"},
                                        {"WORLD_SIZE", "8"},
                                        {"LOCAL_RANK", "1"},
                                        {"LOCAL_WORLD_SIZE", "4"},
                                        {"MASTER_ADDR", "node0"},
                                        {"MASTER_PORT", "29511"}}));
  EXPECT_EQ(t.launcher, "torchrun");
  EXPECT_EQ(t.rank, 5);
  EXPECT_EQ(t.world_size, 8);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.master_addr, "node0");
  EXPECT_EQ(t.master_port, 29511);
  LaunchEnv m = launch_env_from(env_of({{"OMPI_COMM_WORLD_RANK", "2"},
                                        {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  EXPECT_EQ(m.launcher, "mpirun");
  EXPECT_EQ(m.rank, 2);
  EXPECT_EQ(m.local_world_size, 2);
  EXPECT_EQ(m.master_addr, "127.0.0.1");
  LaunchEnv s = launch_env_from(env_of({}));
  EXPECT_EQ(s.launcher, "single");
  EXPECT_EQ(s.world_size, 1);
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  EXPECT_NE(error_of([] {
              launch_env_from(env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}));
            }).find("RANK='x'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              launch_env_from(env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}));
            }).find("RANK=2 is outside"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              launch_env_from(env_of({{"RANK", "0"}}));
            }).find("WORLD_SIZE is not set"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              launch_env_from(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}));
            }).find("MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              launch_env_from(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}));
            }).find("MASTER_PORT=70000"),
            std::string::npos);
}

TEST(LaunchEnv, ValidateAgainstLayoutAndDevices) {
  LaunchEnv e;
  e.world_size = 4;
  e.rank = 3;
  e.local_rank = 3;
  e.local_world_size = 4;
  EXPECT_NO_THROW(validate_launch(e, ParallelLayout::make(2, 4), 4));
  EXPECT_NE(error_of([&] { validate_launch(e, ParallelLayout::make(8, 1), 8); }).find("needs 8"), std::string::npos);
  EXPECT_NE(error_of([&] { validate_launch(e, ParallelLayout::make(4, 1), 2); }).find("needs GPU 3 but 2 GPU(s)"),
            std::string::npos);
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(Rendezvous, RankZeroSharesItsBlob) {
  const int n = 4, port = free_port();
  std::vector<std::vector<uint8_t>> got(n);
  std::vector<std::thread> ts;
  for (int r = n - 1; r >= 0; --r) {  // rank 0 starts last: the others must retry their connects
    ts.emplace_back([&, r] {
      LaunchEnv e;
      e.rank = r;
      e.world_size = n;
      e.local_world_size = n;
      e.local_rank = r;
      e.master_port = port;
      std::vector<uint8_t> mine;
      if (r == 0)
        for (int i = 0; i < 128; ++i) mine.push_back(static_cast<uint8_t>(i * 7 + 3));
      got[r] = tcp_share_blob(e, mine, 20);
    });
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : ts) t.join();
  for (int r = 1; r < n; ++r) EXPECT_EQ(got[r], got[0]) << "rank " << r;
  EXPECT_EQ(got[0].size(), 128u);
}

TEST(Rendezvous, UnreachableRankZeroTimesOutClearly) {
  LaunchEnv e;
  e.rank = 1;
  e.world_size = 2;
  e.local_world_size = 2;
  e.local_rank = 1;
  e.master_port = free_port();
  const std::string msg = error_of([&] { tcp_share_blob(e, {}, 0.3); });
  EXPECT_NE(msg.find("could not reach rank 0 at 127.0.0.1"), std::string::npos) << msg;
}

}  // namespace
}  // namespace deepinfer
