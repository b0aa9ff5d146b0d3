// The CUDA runtime pieces the backend stands on: device selection, an owned stream, a caching device
// allocator (plain cudaMalloc, never managed memory), a per-step workspace arena on top of it, pinned host
// buffers, and a sticky device status word that kernels raise instead of trapping.
//
// Ownership and ordering: everything here is used from one host thread per backend. Device memory handed
// out by the allocator or the arena is only touched by work on the backend's stream, so freeing a block (or
// rewinding the arena) and reusing it for the next op is safe without events: the stream orders them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/ops/cuda/cuda_check.h"

namespace deepinfer::cuda {

// Number of visible CUDA devices; 0 when there is no driver or no GPU (never throws), so tests can skip.
int device_count();

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t total_memory = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;
};

// Makes `index` the current device of the calling thread and describes it.
DeviceInfo select_device(int index);

// `known` (DeviceInfo::smem_per_block_optin as a backend read it once), or when 0 the current device's opt-in shared
// memory a block, asked of the runtime.
size_t smem_optin_or_current(size_t known);

// An owned non-blocking stream (it does not synchronise with the legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

// Blocks set apart for recorded work (CUDA graphs). A graph replays the addresses its recording ran with, so
// the temporaries of a recording must never be handed to anyone else: blocks taken while a pool is active
// belong to that pool and go back to its own free list when freed, whatever is active then.
struct AllocatorPool {
  std::multimap<size_t, void*> free_blocks;  // rounded size -> ptr
  size_t owned_bytes = 0;
};

// Caching allocator: freed blocks go to a free list keyed by rounded size and are handed out again before
// cudaMalloc is asked; cudaMalloc failing once triggers a release of the cache and one retry. Sizes are
// rounded (512 B below 1 MiB, 2 MiB above) so that steps of slightly varying shapes reuse blocks.
class DeviceAllocator {
 public:
  DeviceAllocator() = default;
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  void* allocate(size_t bytes);
  void free(void* ptr);   // nullptr is a no-op; unknown pointers throw
  void release_cached();  // cudaFree every cached block (not the live ones)

  size_t live_bytes() const { return live_bytes_; }
  size_t cached_bytes() const { return cached_bytes_; }
  size_t cuda_malloc_calls() const { return malloc_calls_; }
  size_t allocate_calls() const { return allocate_calls_; }  // every allocate(), cached or not
  static size_t round_size(size_t bytes);

  // Allocations made from now on come from `pool` (nullptr: the shared cache again); returns the previous one.
  AllocatorPool* use_pool(AllocatorPool* pool);
  AllocatorPool* active_pool() const { return pool_; }
  // Gives the pool's memory back (after a device sync): free blocks are cudaFree'd, blocks still live become
  // ordinary shared blocks. The pool must not be active.
  void release_pool(AllocatorPool& pool);

 private:
  std::unordered_map<void*, size_t> live_;             // ptr -> rounded size
  std::multimap<size_t, void*> free_blocks_;           // rounded size -> ptr
  std::unordered_map<void*, AllocatorPool*> pool_of_;  // blocks owned by a pool
  AllocatorPool* pool_ = nullptr;
  size_t live_bytes_ = 0, cached_bytes_ = 0, malloc_calls_ = 0, allocate_calls_ = 0;
};

// Makes `pool` the allocator's active pool for a scope (nullptr: the shared cache, e.g. for memory that outlives
// a recording), restoring the previous one on exit.
class ScopedAllocatorPool {
 public:
  ScopedAllocatorPool(DeviceAllocator& alloc, AllocatorPool* pool) : alloc_(alloc), prev_(alloc.use_pool(pool)) {}
  ~ScopedAllocatorPool() { alloc_.use_pool(prev_); }
  ScopedAllocatorPool(const ScopedAllocatorPool&) = delete;
  ScopedAllocatorPool& operator=(const ScopedAllocatorPool&) = delete;

 private:
  DeviceAllocator& alloc_;
  AllocatorPool* prev_;
};

// RAII device buffer from a DeviceAllocator.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceAllocator& alloc, size_t bytes) : alloc_(&alloc), ptr_(alloc.allocate(bytes)), size_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : alloc_(o.alloc_), ptr_(o.ptr_), size_(o.size_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void reset();
  void* data() const { return ptr_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return size_; }

 private:
  DeviceAllocator* alloc_ = nullptr;
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Per-step scratch: a bump allocator over allocator chunks. Ops take scratch with take() inside a Scope
// that rewinds on exit; the engine calls reset() once per step. When a take() does not fit, a new chunk is
// added (old ones stay valid until reset(), which merges them into one chunk of the high-water size so the
// next step needs a single chunk).
class WorkspaceArena {
 public:
  explicit WorkspaceArena(DeviceAllocator& alloc, size_t initial_bytes = 64ull << 20);
  ~WorkspaceArena();
  WorkspaceArena(const WorkspaceArena&) = delete;
  WorkspaceArena& operator=(const WorkspaceArena&) = delete;

  static constexpr size_t kAlignment = 256;  // cuBLASLt and 16-byte vector loads are happy with this
  void* take(size_t bytes);
  template <typename T>
  T* take_as(int64_t count) {
    return static_cast<T*>(take(sizeof(T) * static_cast<size_t>(count)));
  }
  void reset();
  size_t high_water() const { return high_water_; }
  // The first chunk and the chunk count: both unchanged over a region means no memory it used was replaced.
  const void* base() const { return chunks_.empty() ? nullptr : chunks_.front().ptr; }
  size_t chunk_count() const { return chunks_.size(); }

  struct Mark {
    size_t chunk, offset, used;
  };
  Mark mark() const { return {chunks_.size() - 1, offset_, used_}; }
  void rewind(const Mark& m);

  // Rewinds to the mark taken at construction.
  class Scope {
   public:
    explicit Scope(WorkspaceArena& a) : arena_(a), mark_(a.mark()) {}
    ~Scope() { arena_.rewind(mark_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    WorkspaceArena& arena_;
    Mark mark_;
  };

 private:
  struct Chunk {
    void* ptr;
    size_t size;
  };
  DeviceAllocator& alloc_;
  std::vector<Chunk> chunks_;
  size_t offset_ = 0;      // in the last chunk
  size_t used_ = 0;        // over all chunks since reset
  size_t high_water_ = 0;  // max used_ since construction
};

// Page-locked host memory (cudaMallocHost) for asynchronous host<->device copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_) { o.ptr_ = nullptr; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return ptr_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Kernels cannot throw: on bad data (a token id out of range, an expert id outside [0, E)) they OR a bit
// into this word and skip the element (the output row is NaN). check() reads it after a sync and throws.
enum DeviceStatusBits : uint32_t {
  kStatusEmbeddingIdRange = 1u << 0,
  kStatusRouterHashRange = 1u << 1,
  kStatusExpertIdRange = 1u << 2,
  kStatusPagedAttentionRange = 1u << 3,
  kStatusSampleRange = 1u << 4,
  kStatusScatterRange = 1u << 5,
  kStatusRecordEncode = 1u << 6,
};

class DeviceStatus {
 public:
  explicit DeviceStatus(DeviceAllocator& alloc);
  uint32_t* word() const { return buffer_.data_as<uint32_t>(); }
  // Synchronises `stream`, then throws InvalidArgument naming every raised bit (and clears them).
  void check(cudaStream_t stream);

 private:
  DeviceBuffer buffer_;
  PinnedBuffer host_;
};

}  // namespace deepinfer::cuda
