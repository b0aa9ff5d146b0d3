#include "deepinfer/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "deepinfer/core/error.h"

namespace deepinfer {

using nlohmann::json;

namespace {
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

// The alignment a tensor of `t` needs: its element size (1 for sub-byte and byte types).
uint64_t element_alignment(DType t) { return static_cast<uint64_t>(std::max(1, dtype_bits(t) / 8)); }

uint64_t checked_u64(const json& v, const std::string& what, const std::string& field) {
  DI_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0))
      << what << ": " << field << " must be a non-negative integer, got " << v.dump();
  return v.get<uint64_t>();
}
}  // namespace

std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view text, uint64_t data_size,
                                                       std::map<std::string, std::string>* metadata,
                                                       const std::string& what) {
  json header;
  try {
    header = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    DI_FAIL(ErrorCode::kInvalidArgument) << what << ": header is not valid JSON (" << e.what() << ")";
  }
  DI_CHECK(header.is_object()) << what << ": header must be a JSON object";

  std::vector<SafetensorsEntry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      DI_CHECK(v.is_object()) << what << ": __metadata__ must be an object of strings";
      for (auto m = v.begin(); m != v.end(); ++m) {
        DI_CHECK(m.value().is_string()) << what << ": __metadata__[" << m.key() << "] is not a string";
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = what + ": tensor '" + name + "'";
    DI_CHECK(!name.empty()) << what << ": empty tensor name";
    DI_CHECK(v.is_object()) << where << " entry is not an object";
    DI_CHECK(v.contains("dtype") && v["dtype"].is_string()) << where << " has no dtype string";
    DI_CHECK(v.contains("shape") && v["shape"].is_array()) << where << " has no shape array";
    DI_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2)
        << where << " needs data_offsets [begin, end]";
    SafetensorsEntry e;
    e.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    auto dtype = dtype_from_safetensors(dt);
    DI_CHECK(dtype.has_value()) << where << " has unknown dtype '" << dt << "'";
    e.dtype = *dtype;
    // numel * bits must not overflow: bound each dimension and the running product.
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      uint64_t n = checked_u64(d, where, "shape dimension");
      DI_CHECK(n == 0 || numel <= (uint64_t{1} << 56) / n) << where << " shape is too large";
      numel *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    e.begin = checked_u64(v["data_offsets"][0], where, "data_offsets[0]");
    e.end = checked_u64(v["data_offsets"][1], where, "data_offsets[1]");
    DI_CHECK(e.begin <= e.end) << where << " has data_offsets begin " << e.begin << " > end " << e.end;
    DI_CHECK(e.end <= data_size) << where << " ends at byte " << e.end << " but the data section has only " << data_size
                                 << " bytes (truncated file?)";
    const uint64_t expected = static_cast<uint64_t>(dtype_bytes(e.dtype, static_cast<int64_t>(numel)));
    DI_CHECK(e.end - e.begin == expected) << where << " shape " << shape_str(e.shape) << " of " << dt << " needs "
                                          << expected << " bytes but data_offsets give " << (e.end - e.begin);
    entries.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    DI_CHECK(by_offset[i]->begin >= by_offset[i - 1]->end)
        << what << ": tensors '" << by_offset[i - 1]->name << "' and '" << by_offset[i]->name
        << "' overlap in the data section";
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return entries;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  f->file_ = MappedFile(path);
  const size_t size = f->file_.size();
  DI_CHECK(size >= 8) << path << ": too small for a safetensors file (" << size << " bytes)";
  uint64_t header_len = 0;
  std::memcpy(&header_len, f->file_.data(), 8);  // little-endian on every supported host
  DI_CHECK(header_len <= kMaxHeaderBytes) << path << ": header length " << header_len << " exceeds the limit";
  DI_CHECK(header_len <= size - 8) << path << ": header length " << header_len << " exceeds the file size " << size
                                   << " (truncated file?)";
  std::string_view text(reinterpret_cast<const char*>(f->file_.data() + 8), header_len);
  f->data_offset_ = 8 + header_len;
  f->entries_ = parse_safetensors_header(text, size - f->data_offset_, &f->metadata_, path);
  // Tensors are used in place (typed loads from the mapping, whose base is page-aligned): a tensor whose file offset
  // is not a multiple of its element size would be read through misaligned pointers (undefined behaviour, found by
  // UBSan). Writers keep every tensor aligned by ordering them by element size (the safetensors library does so,
  // and write_safetensors below).
  for (const SafetensorsEntry& e : f->entries_) {
    const uint64_t align = element_alignment(e.dtype);
    DI_CHECK(e.end == e.begin || (f->data_offset_ + e.begin) % align == 0)
        << path << ": tensor '" << e.name << "' (" << dtype_safetensors_name(e.dtype) << ") starts at byte "
        << f->data_offset_ + e.begin << " of the file, not a multiple of its " << align
        << "-byte element size; tensors are mapped in place and must be aligned";
  }
  for (size_t i = 0; i < f->entries_.size(); ++i) f->index_[f->entries_[i].name] = i;
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  DI_CHECK_CODE(e != nullptr, ErrorCode::kNotFound) << path() << ": no tensor named '" << name << "'";
  return tensor(*e);
}

Tensor SafetensorsFile::tensor(const SafetensorsEntry& e) const {
  auto* p = const_cast<uint8_t*>(file_.data() + data_offset_ + e.begin);
  return Tensor(p, e.dtype, e.shape);
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsWriteItem*> sorted;
  for (const auto& it : items) sorted.push_back(&it);
  // Larger elements first, then by name: every tensor starts at a multiple of its element size (each one before
  // it has a size that is a multiple of an element size at least as large), which SafetensorsFile::open requires.
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) {
    const uint64_t ea = element_alignment(a->dtype), eb = element_alignment(b->dtype);
    return ea != eb ? ea > eb : a->name < b->name;
  });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto* it : sorted) {
    DI_CHECK(!header.contains(it->name)) << "write_safetensors: duplicate tensor '" << it->name << "'";
    uint64_t n = static_cast<uint64_t>(dtype_bytes(it->dtype, shape_numel(it->shape)));
    header[it->name] = {{"dtype", std::string(dtype_safetensors_name(it->dtype))},
                        {"shape", it->shape},
                        {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DI_CHECK_CODE(out.good(), ErrorCode::kNotFound) << "cannot write '" << path << "'";
  uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto* it : sorted) {
    int64_t n = dtype_bytes(it->dtype, shape_numel(it->shape));
    if (n > 0) out.write(static_cast<const char*>(it->data), n);
  }
  out.close();
  DI_CHECK_CODE(!out.fail(), ErrorCode::kResourceExhausted) << "writing '" << path << "' failed (disk full?)";
}

}  // namespace deepinfer
