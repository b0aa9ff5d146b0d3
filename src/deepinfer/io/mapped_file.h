// A read-only memory mapping of a whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace deepinfer {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws NotFound (missing/unreadable) naming the path.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace deepinfer
