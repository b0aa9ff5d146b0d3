#include "deepinfer/ops/cuda/cuda_runtime.h"

#include <algorithm>
#include <iterator>
#include <sstream>

namespace deepinfer::cuda {

void raise_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  // Reset the thread's last-error slot: a non-sticky error that was reported (and perhaps caught) here must
  // not resurface at the next unrelated DI_CUDA_CHECK_LAUNCH. Sticky errors come back regardless.
  (void)cudaGetLastError();
  const ErrorCode code = err == cudaErrorMemoryAllocation ? ErrorCode::kResourceExhausted : ErrorCode::kInternal;
  std::ostringstream msg;
  msg << expr << " failed: " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ")";
  throw Error(code, msg.str(), file, line);
}

void raise_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
  const ErrorCode code = status == CUBLAS_STATUS_ALLOC_FAILED    ? ErrorCode::kResourceExhausted
                         : status == CUBLAS_STATUS_NOT_SUPPORTED ? ErrorCode::kUnsupported
                                                                 : ErrorCode::kInternal;
  std::ostringstream msg;
  msg << expr << " failed: cuBLAS status " << static_cast<int>(status);
  throw Error(code, msg.str(), file, line);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the "no driver" error so it does not surface at the next check
    return 0;
  }
  return n;
}

DeviceInfo select_device(int index) {
  const int n = device_count();
  DI_CHECK_CODE(index >= 0 && index < n, ErrorCode::kNotFound)
      << "CUDA device " << index << " requested, " << n << " visible";
  DI_CUDA_CHECK(cudaSetDevice(index));
  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.total_memory = prop.totalGlobalMem;
  info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  info.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  return info;
}

size_t smem_optin_or_current(size_t known) {
  if (known > 0) return known;
  int dev = 0, v = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return static_cast<size_t>(v);
}

Stream::Stream() { DI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);  // destructors do not throw; a failure here has nowhere to go
}
void Stream::synchronize() const { DI_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

// ---------------------------------------------------------------------------------------------- allocator
size_t DeviceAllocator::round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = 2ull << 20, kSmallLimit = 1ull << 20;
  if (bytes == 0) bytes = 1;
  const size_t q = bytes < kSmallLimit ? kSmall : kLarge;
  return (bytes + q - 1) / q * q;
}

void* DeviceAllocator::allocate(size_t bytes) {
  ++allocate_calls_;
  const size_t size = round_size(bytes);
  // Reuse a cached block of exactly this rounded size, or of up to 2x for small requests; never hand out a
  // much larger block (it would pin memory a later large request needs).
  std::multimap<size_t, void*>& blocks = pool_ ? pool_->free_blocks : free_blocks_;
  auto it = blocks.lower_bound(size);
  if (it != blocks.end() && it->first <= size * 2) {
    void* p = it->second;
    const size_t got = it->first;
    blocks.erase(it);
    if (!pool_) cached_bytes_ -= got;
    live_.emplace(p, got);
    live_bytes_ += got;
    return p;
  }
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, size);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    release_cached();
    err = cudaMalloc(&p, size);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    DI_FAIL(ErrorCode::kResourceExhausted)
        << "cudaMalloc(" << size << ") failed: " << cudaGetErrorString(err) << " (live " << live_bytes_ << " B)";
  }
  ++malloc_calls_;
  live_.emplace(p, size);
  live_bytes_ += size;
  if (pool_) {
    pool_of_.emplace(p, pool_);
    pool_->owned_bytes += size;
  }
  return p;
}

void DeviceAllocator::free(void* ptr) {
  if (!ptr) return;
  auto it = live_.find(ptr);
  DI_CHECK_INTERNAL(it != live_.end()) << "DeviceAllocator::free of a pointer it did not allocate";
  if (auto owner = pool_of_.find(ptr); owner != pool_of_.end()) {
    owner->second->free_blocks.emplace(it->second, ptr);
  } else {
    free_blocks_.emplace(it->second, ptr);
    cached_bytes_ += it->second;
  }
  live_bytes_ -= it->second;
  live_.erase(it);
}

AllocatorPool* DeviceAllocator::use_pool(AllocatorPool* pool) {
  AllocatorPool* prev = pool_;
  pool_ = pool;
  return prev;
}

void DeviceAllocator::release_pool(AllocatorPool& pool) {
  DI_CHECK_INTERNAL(pool_ != &pool) << "release_pool of the active pool";
  // A replay may still be running on the stream.
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto& [size, p] : pool.free_blocks) {
    pool_of_.erase(p);
    DI_CUDA_CHECK(cudaFree(p));
  }
  pool.free_blocks.clear();
  for (auto it = pool_of_.begin(); it != pool_of_.end();) it = it->second == &pool ? pool_of_.erase(it) : std::next(it);
  pool.owned_bytes = 0;
}

void DeviceAllocator::release_cached() {
  // Work queued on the stream may still read blocks that were freed to the cache: wait before cudaFree.
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto& [size, p] : free_blocks_) DI_CUDA_CHECK(cudaFree(p));
  free_blocks_.clear();
  cached_bytes_ = 0;
}

DeviceAllocator::~DeviceAllocator() {
  cudaDeviceSynchronize();
  for (auto& [size, p] : free_blocks_) cudaFree(p);
  for (auto& [p, size] : live_) cudaFree(p);
  for (auto& [p, pool] : pool_of_)
    if (!live_.count(p)) cudaFree(p);  // free blocks of pools never released
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    alloc_ = o.alloc_;
    ptr_ = o.ptr_;
    size_ = o.size_;
    o.ptr_ = nullptr;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (ptr_ && alloc_) alloc_->free(ptr_);
  ptr_ = nullptr;
  size_ = 0;
}

// ---------------------------------------------------------------------------------------------- arena
WorkspaceArena::WorkspaceArena(DeviceAllocator& alloc, size_t initial_bytes) : alloc_(alloc) {
  chunks_.push_back({alloc_.allocate(initial_bytes), DeviceAllocator::round_size(initial_bytes)});
}

WorkspaceArena::~WorkspaceArena() {
  for (auto& c : chunks_) alloc_.free(c.ptr);
}

void* WorkspaceArena::take(size_t bytes) {
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (offset_ + bytes > chunks_.back().size) {
    const size_t size = std::max(bytes, chunks_.back().size * 2);
    chunks_.push_back({alloc_.allocate(size), DeviceAllocator::round_size(size)});
    offset_ = 0;
  }
  void* p = static_cast<char*>(chunks_.back().ptr) + offset_;
  offset_ += bytes;
  used_ += bytes;
  high_water_ = std::max(high_water_, used_);
  return p;
}

void WorkspaceArena::rewind(const Mark& m) {
  // Chunks added after the mark stay until reset(): work queued on the stream may still use them, and the
  // allocator's cache is stream-ordered only for blocks that are freed, not for blocks that are reused.
  if (m.chunk == chunks_.size() - 1) {
    offset_ = m.offset;
    used_ = m.used;
  } else if (m.used == 0) {
    // The outermost scope closed after growing the arena: merge now. Without this, nothing in the engine
    // calls reset(), every scope that overflows adds a chunk (doubling) and the dead scope's bytes are never
    // reused: memory grows with each large GEMM/MoE call and each growth is a cudaMalloc.
    reset();
  }
}

void WorkspaceArena::reset() {
  if (chunks_.size() > 1) {
    // Merge into one chunk of the high-water size. Freed chunks go back to the allocator's cache; only work
    // on the same stream can get them again, after the work that used them.
    const size_t size = high_water_;
    for (auto& c : chunks_) alloc_.free(c.ptr);
    chunks_.clear();
    chunks_.push_back({alloc_.allocate(size), DeviceAllocator::round_size(size)});
  }
  offset_ = 0;
  used_ = 0;
}

// ---------------------------------------------------------------------------------------------- pinned
PinnedBuffer::PinnedBuffer(size_t bytes) : size_(bytes) { DI_CUDA_CHECK(cudaMallocHost(&ptr_, bytes)); }
PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = o.ptr_;
    size_ = o.size_;
    o.ptr_ = nullptr;
  }
  return *this;
}

// ---------------------------------------------------------------------------------------------- status
DeviceStatus::DeviceStatus(DeviceAllocator& alloc) : buffer_(alloc, sizeof(uint32_t)), host_(sizeof(uint32_t)) {
  DI_CUDA_CHECK(cudaMemset(buffer_.data(), 0, sizeof(uint32_t)));
  DI_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy stream's memset, before kernels on non-blocking streams
}

void DeviceStatus::check(cudaStream_t stream) {
  DI_CUDA_CHECK(cudaMemcpyAsync(host_.data(), buffer_.data(), sizeof(uint32_t), cudaMemcpyDeviceToHost, stream));
  DI_CUDA_CHECK(cudaStreamSynchronize(stream));
  const uint32_t bits = *host_.data_as<uint32_t>();
  if (bits == 0) return;
  DI_CUDA_CHECK(cudaMemsetAsync(buffer_.data(), 0, sizeof(uint32_t), stream));
  std::ostringstream msg;
  msg << "device reported bad inputs:";
  if (bits & kStatusEmbeddingIdRange) msg << " embedding token id out of range;";
  if (bits & kStatusRouterHashRange) msg << " router token id outside the hash table;";
  if (bits & kStatusExpertIdRange) msg << " moe expert id out of range;";
  if (bits & kStatusPagedAttentionRange)
    msg << " paged_sink_attention / paged_mla_attention / paged_indexer_scores: a sequence index, position/entry "
           "beyond its block table, or "
           "block id outside the pool;";
  if (bits & kStatusSampleRange) msg << " sample: an rng position outside [0, 2^32);";
  if (bits & kStatusScatterRange) msg << " scatter_rows: a row index outside [-1, destination rows);";
  if (bits & kStatusRecordEncode)
    msg << " quantized cache records (--kv-cache-dtype fp8): a row that its kind did not fake-quantize (stored as "
           "NaNs);";
  DI_FAIL(ErrorCode::kInvalidArgument) << msg.str();
}

}  // namespace deepinfer::cuda
