#include "deepinfer/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "deepinfer/core/error.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using testing::TempDir;

// Writes an 8-byte length + header + data.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes, uint64_t len_override = 0) {
  std::ofstream f(path, std::ios::binary);
  uint64_t len = len_override ? len_override : header.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << header;
  std::string data(data_bytes, '\x11');
  f << data;
}

std::string open_error(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, WriteThenReadRoundTrip) {
  TempDir dir;
  std::vector<uint16_t> a = {0x3F80, 0x4000, 0xC040, 0x0001, 0x7F7F, 0x1234};
  std::vector<uint8_t> fp4 = {0x21, 0x43, 0x65};
  std::vector<int64_t> ids = {5, -7};
  write_safetensors(dir.file("x.safetensors"),
                    {{"b.weight", DType::kBF16, {2, 3}, a.data()},
                     {"a.packed", DType::kFP4E2M1, {6}, fp4.data()},
                     {"c.ids", DType::kI64, {2}, ids.data()}},
                    {{"format", "pt"}});
  auto f = SafetensorsFile::open(dir.file("x.safetensors"));
  ASSERT_EQ(f->entries().size(), 3u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  Tensor t = f->tensor("b.weight");
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(t.data(), a.data(), 12), 0);
  EXPECT_EQ(load_as_f32(f->tensor("a.packed").data(), DType::kFP4E2M1, 1), 1.0f);  // nibble 2 of byte 0x21
  EXPECT_EQ(f->tensor("c.ids").data_as<int64_t>()[1], -7);
  // Header padded to 8 and tensors ordered by element size: each starts at a multiple of its element size, though
  // the 3-byte fp4 tensor sorts before the i64 one by name (UBSan: reading c.ids misaligned was undefined).
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->tensor("c.ids").data()) % 8, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->tensor("b.weight").data()) % 2, 0u);
  EXPECT_THROW(f->tensor("nope"), Error);
}

TEST(Safetensors, RejectsMisalignedTensors) {
  TempDir dir;
  // A valid header whose I64 tensor starts 3 bytes into an 8-aligned data section: mapped in place, it would be read
  // through misaligned pointers.
  std::string header = R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"I64","shape":[1],)"
                       R"("data_offsets":[3,11]}})";
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');
  write_raw(dir.file("m.safetensors"), header, 11);
  const std::string err = open_error(dir.file("m.safetensors"));
  EXPECT_NE(err.find("tensor 'b' (I64) starts at byte"), std::string::npos) << err;
  EXPECT_NE(err.find("not a multiple of its 8-byte element size"), std::string::npos) << err;
  // The same tensors, I64 first: accepted.
  std::string ok = R"({"b":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},"a":{"dtype":"U8","shape":[3],)"
                   R"("data_offsets":[8,11]}})";
  while ((8 + ok.size()) % 8 != 0) ok.push_back(' ');
  write_raw(dir.file("ok.safetensors"), ok, 11);
  EXPECT_EQ(open_error(dir.file("ok.safetensors")), "");
}

TEST(Safetensors, RejectsMalformedFiles) {
  TempDir dir;
  struct Case {
    std::string header;
    size_t data;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"{not json", 0, "not valid JSON"},
      {"[1,2]", 0, "must be a JSON object"},
      {R"({"t":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype 'F12'"},
      {R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "needs 12 bytes"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "truncated"},
      {R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "non-negative"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "begin 8 > end 0"},
      {R"({"t":{"dtype":"F32","shape":[2]}})", 8, "data_offsets"},
      {R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8, "no dtype"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "overlap"},
      {R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8, "too large"},
      {R"({"__metadata__":{"k":1}})", 0, "not a string"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir.file("c" + std::to_string(i) + ".safetensors");
    write_raw(path, cases[i].header, cases[i].data);
    std::string err = open_error(path);
    EXPECT_NE(err.find(cases[i].expect), std::string::npos) << "case " << i << ": " << err;
    EXPECT_NE(err.find(path), std::string::npos) << "error must name the file: " << err;
  }
}

TEST(Safetensors, RejectsTruncatedAndTinyFiles) {
  TempDir dir;
  write_raw(dir.file("len.safetensors"), "{}", 0, 1000);  // header length beyond the file
  EXPECT_NE(open_error(dir.file("len.safetensors")).find("exceeds the file size"), std::string::npos);
  testing::write_file(dir.file("tiny.safetensors"), "abc");
  EXPECT_NE(open_error(dir.file("tiny.safetensors")).find("too small"), std::string::npos);
  EXPECT_NE(open_error(dir.file("missing.safetensors")).find("cannot open"), std::string::npos);
  // A valid file cut in the middle of its data.
  std::vector<float> v(64, 1.0f);
  write_safetensors(dir.file("full.safetensors"), {{"w", DType::kF32, {64}, v.data()}});
  std::ifstream in(dir.file("full.safetensors"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  testing::write_file(dir.file("cut.safetensors"), bytes.substr(0, bytes.size() - 10));
  EXPECT_NE(open_error(dir.file("cut.safetensors")).find("truncated"), std::string::npos);
}

TEST(Safetensors, AcceptsEveryDTypeName) {
  for (const char* name :
       {"F32", "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "U8", "I16", "I32", "I64", "BOOL"}) {
    std::string h = std::string(R"({"t":{"dtype":")") + name + R"(","shape":[0],"data_offsets":[0,0]}})";
    EXPECT_NO_THROW(parse_safetensors_header(h, 0, nullptr, "mem")) << name;
  }
}

}  // namespace
}  // namespace deepinfer
