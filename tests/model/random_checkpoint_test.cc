// write_random_checkpoint: a long tensor drawn in pieces on several threads (the generator skipped to each piece's
// first value) holds the values of one sequential pass, byte for byte, in every tensor kind and storage format.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "deepinfer/model/random_checkpoint.h"
#include "test_util.h"
#include "v4_quant_config.h"

namespace deepinfer {
namespace {

TEST(RandomCheckpoint, PiecesOnThreadsGiveTheSequentialValues) {
  testing::TempDir tmp;
  nlohmann::json cfg =
      nlohmann::json::parse(testing::read_file_or_empty(testing::test_data_dir() + "/configs/deepseek_v4.json"));
  cfg["quantization_config"] = testing::v4_quantization_config();
  testing::write_file(tmp.file("in.json"), cfg.dump());
  RandomCheckpointOptions seq;
  seq.config_path = tmp.file("in.json");
  seq.out_dir = tmp.path() + "/seq";
  seq.seed = 7;
  seq.threads = 1;  // one piece a tensor: the sequential draw
  RandomCheckpointOptions pieces = seq;
  pieces.out_dir = tmp.path() + "/pieces";
  pieces.threads = 3;
  pieces.piece_values = 100;  // every tensor of 200+ values in up to 3 pieces of uneven ends
  ASSERT_GT(write_random_checkpoint(seq), 0);
  ASSERT_EQ(write_random_checkpoint(pieces), write_random_checkpoint(seq));
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(seq.out_dir)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(testing::read_file_or_empty(e.path().string()), testing::read_file_or_empty(pieces.out_dir + "/" + name))
        << name;
    ++files;
  }
  EXPECT_GE(files, 2);  // config.json and the weights
}

}  // namespace
}  // namespace deepinfer
