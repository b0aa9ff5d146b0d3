#include "deepinfer/io/checkpoint.h"

#include <gtest/gtest.h>

#include "deepinfer/core/error.h"
#include "test_util.h"

namespace deepinfer {
namespace {

using testing::TempDir;
using testing::write_file;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, ShardedIndexIsValidated) {
  TempDir d;
  std::vector<float> a(4, 1.0f), b(2, 2.0f);
  write_safetensors(d.file("model-0.safetensors"), {{"x.weight", DType::kF32, {4}, a.data()}});
  write_safetensors(d.file("model-1.safetensors"), {{"y.weight", DType::kF32, {2}, b.data()}});
  write_file(d.file("model.safetensors.index.json"),
             R"({"weight_map":{"x.weight":"model-0.safetensors","y.weight":"model-1.safetensors"}})");
  auto ck = Checkpoint::open(d.path());
  EXPECT_EQ(ck->shards().size(), 2u);
  EXPECT_EQ(ck->tensor("y.weight").data_as<float>()[1], 2.0f);
  EXPECT_EQ(ck->total_bytes(), 24u);
  EXPECT_NE(error_of([&] { ck->tensor("z"); }).find("missing tensor 'z'"), std::string::npos);

  write_file(d.file("model.safetensors.index.json"),
             R"({"weight_map":{"x.weight":"model-1.safetensors","y.weight":"model-1.safetensors"}})");
  EXPECT_NE(error_of([&] { Checkpoint::open(d.path()); }).find("is not in that file"), std::string::npos);
  write_file(d.file("model.safetensors.index.json"), R"({"weight_map":{"x.weight":"model-9.safetensors"}})");
  EXPECT_NE(error_of([&] { Checkpoint::open(d.path()); }).find("model-9.safetensors"), std::string::npos);
  write_file(d.file("model.safetensors.index.json"), R"({"weight_map":{"x.weight":"../etc/passwd"}})");
  EXPECT_NE(error_of([&] { Checkpoint::open(d.path()); }).find("plain file name"), std::string::npos);
  write_file(d.file("model.safetensors.index.json"), "{oops");
  EXPECT_NE(error_of([&] { Checkpoint::open(d.path()); }).find("not valid JSON"), std::string::npos);
}

TEST(Checkpoint, DuplicateTensorAcrossShardsIsAnError) {
  TempDir d;
  std::vector<float> a(4, 1.0f);
  write_safetensors(d.file("a.safetensors"), {{"x", DType::kF32, {4}, a.data()}});
  write_safetensors(d.file("b.safetensors"), {{"x", DType::kF32, {4}, a.data()}});
  EXPECT_NE(error_of([&] { Checkpoint::open(d.path()); }).find("appears in both"), std::string::npos);
}

TEST(Checkpoint, MissingDirectoryAndEmptyDirectory) {
  TempDir d;
  EXPECT_NE(error_of([&] { Checkpoint::open(d.file("nope")); }).find("does not exist"), std::string::npos);
  EXPECT_NE(error_of([&] { Checkpoint::open(d.path()); }).find("no *.safetensors"), std::string::npos);
}

TEST(ModelResolution, FlagBeatsEnvBeatsDefault) {
  TempDir a, b, c;
  for (auto* d : {&a, &b, &c}) write_file(d->file("config.json"), "{}");
  EXPECT_EQ(resolve_model_dir(a.path(), b.path(), c.path()).source, "--model");
  EXPECT_EQ(resolve_model_dir(a.path(), b.path(), c.path()).dir, a.path());
  EXPECT_EQ(resolve_model_dir(std::nullopt, b.path(), c.path()).source, "DEEPINFER_HF_MODEL_DIR");
  EXPECT_EQ(resolve_model_dir(std::nullopt, std::nullopt, c.path()).source, "embedded default");
  std::string err = error_of([&] { resolve_model_dir(std::string("/no/such/dir"), b.path(), c.path()); });
  EXPECT_NE(err.find("/no/such/dir"), std::string::npos);
  EXPECT_NE(err.find("--model"), std::string::npos);
  TempDir empty;
  err = error_of([&] { resolve_model_dir(std::nullopt, empty.path(), c.path()); });
  EXPECT_NE(err.find("has no config.json"), std::string::npos);
  EXPECT_NE(err.find("DEEPINFER_HF_MODEL_DIR"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer
