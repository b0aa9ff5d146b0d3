#include <gtest/gtest.h>

#include "deepinfer/tokenizer/tokenizer.h"
#include "test_util.h"

namespace deepinfer::tokenizer {
namespace {

TEST(TokenizerSmoke, LoadsV3) {
  if (!testing::shared_available()) GTEST_SKIP() << "../shared absent";
  auto tok = Tokenizer::from_file(testing::shared_dir() + "/data/tokenizers/deepseek_v3/tokenizer.json");
  auto ids = tok->encode("Hello world! 12345 你好世界<｜User｜>  x\n\n");
  for (auto i : ids) printf("%d ", i);
  printf("\n%s\n", tok->decode(ids).c_str());
}

}  // namespace
}  // namespace deepinfer::tokenizer
