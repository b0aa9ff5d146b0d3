#include "deepinfer/parallel/nccl_communicator.h"

#include "deepinfer/core/error.h"

#ifdef DEEPINFER_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <numeric>
#endif

namespace deepinfer {

#ifndef DEEPINFER_WITH_NCCL

bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(const LaunchEnv&, const ParallelLayout&) {
  DI_FAIL(ErrorCode::kUnsupported) << "multi-process parallelism needs NCCL: build with DEEPINFER_ACCELERATOR=nvidia "
                                      "and NCCL installed (NCCL_ROOT; see docs/PARALLEL.md)";
}

#else

namespace {

#define DI_NCCL(call)                                                                                  \
  do {                                                                                                 \
    ncclResult_t r_ = (call);                                                                          \
    DI_CHECK_CODE(r_ == ncclSuccess, ErrorCode::kInternal) << #call << ": " << ncclGetErrorString(r_); \
  } while (0)
#define DI_CUDA_OK(call)                                                                               \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    DI_CHECK_CODE(e_ == cudaSuccess, ErrorCode::kInternal) << #call << ": " << cudaGetErrorString(e_); \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return ncclUint8;
    default:
      break;
  }
  DI_FAIL(ErrorCode::kUnsupported) << "nccl: dtype " << dtype_name(t);
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // unregistered host memory on older runtimes
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, int rank, int size)
      : comm_(comm), device_(device), rank_(rank), size_(size) {
    DI_CUDA_OK(cudaSetDevice(device_));
    DI_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (scratch_) cudaFree(scratch_);
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool accepts(Device d) const override { return d.kind == DeviceKind::kCPU || d == Device::cuda(device_); }
  std::string name() const override { return "nccl"; }

  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    const int64_t bytes = count * comm_element_bytes(dtype);
    Staged s = stage(data, bytes, nullptr, 0);
    DI_NCCL(ncclAllReduce(s.in, s.in, count, nccl_type(dtype), nccl_op(op), comm_, stream_));
    unstage(s, data, bytes, 0);
  }

  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    const int64_t bytes = count * comm_element_bytes(dtype);
    Staged s = stage(send, bytes, recv, bytes * size_);
    DI_NCCL(ncclAllGather(s.in, s.out, count, nccl_type(dtype), comm_, stream_));
    unstage(s, recv, 0, bytes * size_);
  }

  void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                    std::span<const int64_t> recv_counts, DType dtype) override {
    DI_CHECK(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_)
        << "all_to_all_v: counts for " << send_counts.size() << "/" << recv_counts.size() << " ranks in a group of "
        << size_;
    const int64_t es = comm_element_bytes(dtype);
    const int64_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0}) * es;
    const int64_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0}) * es;
    Staged s = stage(send, send_total, recv, recv_total);
    const ncclDataType_t t = nccl_type(dtype);
    int64_t so = 0, ro = 0;
    DI_NCCL(ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      if (send_counts[p] > 0)
        DI_NCCL(ncclSend(static_cast<const char*>(s.in) + so, send_counts[p], t, p, comm_, stream_));
      if (recv_counts[p] > 0) DI_NCCL(ncclRecv(static_cast<char*>(s.out) + ro, recv_counts[p], t, p, comm_, stream_));
      so += send_counts[p] * es;
      ro += recv_counts[p] * es;
    }
    DI_NCCL(ncclGroupEnd());
    unstage(s, recv, 0, recv_total);
  }

  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    const int64_t bytes = count * comm_element_bytes(dtype);
    Staged s = stage(data, bytes, nullptr, 0);
    DI_NCCL(ncclBroadcast(s.in, s.in, count, nccl_type(dtype), root, comm_, stream_));
    unstage(s, data, bytes, 0);
  }

  void barrier() override {
    int32_t one = 1;
    all_reduce(&one, 1, DType::kI32, ReduceOp::kSum);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    ncclComm_t sub = nullptr;
    DI_NCCL(ncclCommSplit(comm_, color, key, &sub, nullptr));
    int r = 0, n = 0;
    DI_NCCL(ncclCommUserRank(sub, &r));
    DI_NCCL(ncclCommCount(sub, &n));
    return std::make_unique<NcclCommunicator>(sub, device_, r, n);
  }

 private:
  // Where a collective reads (`in`) and writes (`out`): the caller's device buffers, or the scratch buffer with
  // the host input copied in.
  struct Staged {
    void* in = nullptr;
    void* out = nullptr;
    bool host = false;
  };

  Staged stage(const void* in, int64_t in_bytes, void* out, int64_t out_bytes) {
    DI_CUDA_OK(cudaSetDevice(device_));
    Staged s;
    // Host staging when either side is host memory. An empty piece may come as nullptr (a rank with no tokens that
    // still receives others' rows): a null buffer says nothing, the other side decides.
    auto host = [](const void* p) { return p != nullptr && !is_device_pointer(p); };
    s.host = host(in) || host(out);
    if (!s.host) {
      s.in = const_cast<void*>(in);
      s.out = out;
      return s;
    }
    reserve(in_bytes + out_bytes);
    s.in = scratch_;
    s.out = static_cast<char*>(scratch_) + in_bytes;
    if (in_bytes > 0) DI_CUDA_OK(cudaMemcpyAsync(s.in, in, in_bytes, cudaMemcpyDefault, stream_));
    return s;
  }

  // Copies the results back to host buffers and waits for the stream.
  void unstage(const Staged& s, void* dst, int64_t in_place_bytes, int64_t out_bytes) {
    if (s.host) {
      if (in_place_bytes > 0) DI_CUDA_OK(cudaMemcpyAsync(dst, s.in, in_place_bytes, cudaMemcpyDefault, stream_));
      if (out_bytes > 0) DI_CUDA_OK(cudaMemcpyAsync(dst, s.out, out_bytes, cudaMemcpyDefault, stream_));
    }
    DI_CUDA_OK(cudaStreamSynchronize(stream_));
  }

  void reserve(int64_t bytes) {
    if (bytes <= scratch_bytes_) return;
    if (scratch_) DI_CUDA_OK(cudaFree(scratch_));
    scratch_bytes_ = std::max<int64_t>(bytes, 1 << 20);
    DI_CUDA_OK(cudaMalloc(&scratch_, scratch_bytes_));
  }

  ncclComm_t comm_;
  cudaStream_t stream_ = nullptr;
  int device_, rank_, size_;
  void* scratch_ = nullptr;
  int64_t scratch_bytes_ = 0;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(const LaunchEnv& env, const ParallelLayout& layout) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  validate_launch(env, layout, devices);
  DI_CUDA_OK(cudaSetDevice(env.local_rank));
  ncclUniqueId id{};
  std::vector<uint8_t> blob(sizeof(id));
  if (env.rank == 0) {
    DI_NCCL(ncclGetUniqueId(&id));
    std::memcpy(blob.data(), &id, sizeof(id));
  }
  blob = tcp_share_blob(env, blob);
  DI_CHECK_CODE(blob.size() == sizeof(id), ErrorCode::kInternal)
      << "rendezvous: got " << blob.size() << " bytes for a " << sizeof(id) << "-byte ncclUniqueId";
  std::memcpy(&id, blob.data(), sizeof(id));
  ncclComm_t comm = nullptr;
  DI_NCCL(ncclCommInitRank(&comm, env.world_size, id, env.rank));
  return std::make_unique<NcclCommunicator>(comm, env.local_rank, env.rank, env.world_size);
}

#endif  // DEEPINFER_WITH_NCCL

}  // namespace deepinfer
