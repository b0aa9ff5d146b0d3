#include "deepinfer/tokenizer/word_cache.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace deepinfer::tokenizer {
namespace {

// Random keys of every cached length class (short inline keys, long arena keys) and id lists of inline and
// arena sizes; enough of them to make the table grow several times and then be emptied once.
TEST(WordCache, FindsEveryInsertedKeyAcrossGrowthAndClear) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> len_dist(1, static_cast<int>(WordCache::kMaxKeyBytes));
  std::uniform_int_distribution<int> byte_dist(0, 255);
  std::uniform_int_distribution<int> nid_dist(1, 6);
  std::uniform_int_distribution<int32_t> id_dist(0, 200000);

  WordCache cache;
  std::vector<std::string> keys;
  std::vector<std::vector<int32_t>> ids;
  const size_t total = WordCache::kMaxEntries + 1000;  // the last 1000 land after one clear
  for (size_t k = 0; k < total; ++k) {
    std::string key(len_dist(rng), '\0');
    for (char& c : key) c = static_cast<char>(byte_dist(rng));
    key += std::to_string(k);  // distinct keys
    if (key.size() > WordCache::kMaxKeyBytes) key = key.substr(key.size() - WordCache::kMaxKeyBytes);
    std::vector<int32_t> v(nid_dist(rng));
    for (int32_t& x : v) x = id_dist(rng);
    cache.insert(WordCache::Key(key), v);
    keys.push_back(std::move(key));
    ids.push_back(std::move(v));
  }
  const size_t after_clear = total - 1000;
  size_t found_before = 0;
  for (size_t k = 0; k < total; ++k) {
    std::vector<int32_t> out = {-1};
    const bool hit = cache.find(WordCache::Key(keys[k]), &out);
    if (k >= after_clear) {
      ASSERT_TRUE(hit) << "key " << k << " inserted after the clear is missing";
    }
    if (!hit) continue;
    if (k < after_clear) ++found_before;
    ASSERT_EQ(out.size(), ids[k].size() + 1);
    EXPECT_EQ(out[0], -1);  // appends, does not overwrite
    EXPECT_EQ(std::vector<int32_t>(out.begin() + 1, out.end()), ids[k]) << "key " << k;
  }
  EXPECT_EQ(found_before, 0u) << "entries from before the clear must be gone";
}

TEST(WordCache, MissesUnknownKeysAndSkipsOversizedOnes) {
  WordCache cache;
  const std::vector<int32_t> v = {1, 2};
  cache.insert(WordCache::Key("hello"), v);
  std::vector<int32_t> out;
  EXPECT_FALSE(cache.find(WordCache::Key("hellp"), &out));
  EXPECT_FALSE(cache.find(WordCache::Key("hell"), &out));
  const std::string big(WordCache::kMaxKeyBytes + 1, 'x');
  cache.insert(WordCache::Key(big), v);
  EXPECT_FALSE(cache.find(WordCache::Key(big), &out));
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(cache.find(WordCache::Key("hello"), &out));
  EXPECT_EQ(out, v);
}

}  // namespace
}  // namespace deepinfer::tokenizer
