#include "deepinfer/cli/process_world.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

extern char** environ;

#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/parallel/nccl_communicator.h"

#ifdef DEEPINFER_WITH_CUDA
#include "deepinfer/ops/cuda/cuda_runtime.h"
#endif

namespace deepinfer::cli {
namespace {

// This process's argv, from /proc (the workers rerun the same command).
std::vector<std::string> own_command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string cur;
  for (char c : all) {
    if (c == '\0') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  DI_CHECK_CODE(!args.empty(), ErrorCode::kInternal) << "cannot read /proc/self/cmdline to spawn workers";
  return args;
}

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  DI_CHECK_CODE(fd >= 0, ErrorCode::kInternal) << "socket() failed while picking a rendezvous port";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  DI_CHECK_CODE(ok, ErrorCode::kInternal) << "could not pick a free rendezvous port";
  return ntohs(a.sin_port);
}

int visible_devices() {
#ifdef DEEPINFER_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

}  // namespace

std::unique_ptr<ProcessWorld> ProcessWorld::start(const ParallelLayout& layout) {
  DI_CHECK_CODE(nccl_available(), ErrorCode::kUnsupported)
      << "--device cuda with " << layout.str() << " needs NCCL: build with DEEPINFER_ACCELERATOR=nvidia and NCCL "
      << "(NCCL_ROOT); the CPU backend runs the same layout with in-process ranks";
  auto pw = std::unique_ptr<ProcessWorld>(new ProcessWorld());
  pw->env_ = launch_env_from_process();
  if (pw->env_.launcher == "single") {
    // Self-launch on one node: this process is rank 0 and GPU 0.
    const int gpus = visible_devices();
    DI_CHECK_CODE(gpus >= layout.world, ErrorCode::kNotFound)
        << layout.str() << " needs " << layout.world << " GPUs on this node, " << gpus
        << " visible (CUDA_VISIBLE_DEVICES); several nodes: start one process per GPU with torchrun or mpirun";
    LaunchEnv& e = pw->env_;
    e.world_size = layout.world;
    e.local_world_size = layout.world;
    e.master_addr = "127.0.0.1";
    e.master_port = free_tcp_port();
    const std::vector<std::string> args = own_command_line();
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (int r = 1; r < layout.world; ++r) {
      // The child's environment is built before fork: after it only async-signal-safe calls (execve) are safe.
      std::vector<std::string> env_strings;
      for (char** v = environ; *v; ++v) {
        const std::string kv(*v);
        const std::string name = kv.substr(0, kv.find('='));
        if (name != "RANK" && name != "WORLD_SIZE" && name != "LOCAL_RANK" && name != "LOCAL_WORLD_SIZE" &&
            name != "MASTER_ADDR" && name != "MASTER_PORT")
          env_strings.push_back(kv);
      }
      for (const auto& [k, v] : {std::pair<std::string, std::string>{"RANK", std::to_string(r)},
                                 {"WORLD_SIZE", std::to_string(layout.world)},
                                 {"LOCAL_RANK", std::to_string(r)},
                                 {"LOCAL_WORLD_SIZE", std::to_string(layout.world)},
                                 {"MASTER_ADDR", e.master_addr},
                                 {"MASTER_PORT", std::to_string(e.master_port)}})
        env_strings.push_back(k + "=" + v);
      std::vector<char*> envp;
      for (auto& s : env_strings) envp.push_back(s.data());
      envp.push_back(nullptr);
      const pid_t pid = ::fork();
      DI_CHECK_CODE(pid >= 0, ErrorCode::kInternal) << "fork() failed spawning rank " << r;
      if (pid == 0) {
        ::execve("/proc/self/exe", argv.data(), envp.data());
        ::_exit(127);
      }
      pw->children_.push_back(pid);
    }
    DI_LOG_INFO("spawned {} worker process(es) for {}", layout.world - 1, layout.str());
  }
  pw->comm_ = make_nccl_communicator(pw->env_, layout);
  DI_LOG_INFO("rank {}/{} ({}) on GPU {}: NCCL ready", pw->env_.rank, pw->env_.world_size, pw->env_.launcher,
              pw->env_.local_rank);
  return pw;
}

ProcessWorld::~ProcessWorld() {
  comm_.reset();
  for (int pid : children_) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      DI_LOG_WARN("worker process {} ended with status {}", pid, status);
  }
}

}  // namespace deepinfer::cli
