// safetensors: an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets},
// "__metadata__": {str: str}}, then the data. Everything in the header is validated before any tensor is
// handed out: dtype names, shapes against byte ranges, ranges against the file size, and overlaps.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/core/tensor.h"
#include "deepinfer/io/mapped_file.h"

namespace deepinfer {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

// Parses and validates a header. `data_size` is the number of bytes after the header. Throws
// InvalidArgument with `what` (usually the path) and the offending tensor on any problem.
std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view json, uint64_t data_size,
                                                       std::map<std::string, std::string>* metadata,
                                                       const std::string& what);

class SafetensorsFile {
 public:
  // Maps and validates the file; throws NotFound / InvalidArgument naming the path.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // A CPU view into the mapping (valid while this object lives). Throws NotFound for unknown names.
  Tensor tensor(const std::string& name) const;
  Tensor tensor(const SafetensorsEntry& e) const;

 private:
  MappedFile file_;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: name, dtype, shape and its bytes (dtype_bytes(dtype, numel) of them).
struct SafetensorsWriteItem {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;
};

// Writes a safetensors file (entries sorted by name, data 8-byte aligned via header padding).
void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace deepinfer
