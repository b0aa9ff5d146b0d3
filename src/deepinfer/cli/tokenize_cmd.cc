// deepinfer tokenize: text → ids, ids → text, and chat messages → prompt ids, with the model's tokenizer.json.
//   deepinfer tokenize --model DIR [--text T | --file F]     one JSON array of ids (stdin: one array per line)
//   deepinfer tokenize --tokenizer tokenizer.json --decode 1,2,3
//   deepinfer tokenize --model DIR --chat messages.json --encoding v41 [--thinking] [--reasoning-effort max]
//   deepinfer tokenize --tokenizer tokenizer.json --bench corpus.bin [--threads N] [--repeat R]
// Defaults equal transformers' tokenizer(text, add_special_tokens=False); --no-special reads special-token
// spellings as plain text.
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "deepinfer/cli/commands.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/thread_pool.h"
#include "deepinfer/tokenizer/chat_encoding.h"
#include "deepinfer/tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

struct TokenizeArgs {
  std::string model, tokenizer, text, file, decode, chat, encoding = "v41", reasoning_effort, bench;
  int threads = 0, repeat = 3;
  bool thinking = false, no_special = false, skip_special = false, print_text = false;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DI_CHECK_CODE(f.good(), ErrorCode::kNotFound) << "cannot read " << path;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void print_ids(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  std::cout << s << "]\n";
}

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::string t = text;
  for (char& c : t)
    if (c == '[' || c == ']' || c == ',') c = ' ';
  std::istringstream ss(t);
  std::vector<int32_t> ids;
  std::string item;
  while (ss >> item) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    DI_CHECK(used == item.size() && v >= INT32_MIN && v <= INT32_MAX) << "--decode: '" << item << "' is not a token id";
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

// corpus.bin of tools/tokenizer_reference.py: u32 count, then per document u32 length + bytes.
std::vector<std::string> read_corpus(const std::string& path) {
  const std::string data = read_file(path);
  size_t pos = 0;
  auto u32 = [&] {
    DI_CHECK(pos + 4 <= data.size()) << "--bench: " << path << " is truncated (not a corpus.bin?)";
    uint32_t v;
    std::memcpy(&v, data.data() + pos, 4);
    pos += 4;
    return v;
  };
  std::vector<std::string> docs(u32());
  for (auto& d : docs) {
    const uint32_t n = u32();
    DI_CHECK(pos + n <= data.size()) << "--bench: " << path << " is truncated (not a corpus.bin?)";
    d = data.substr(pos, n);
    pos += n;
  }
  return docs;
}

double cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Encode throughput on one thread and over all threads (best of `repeat` passes each), as one JSON line.
// Per-core numbers divide by CPU time (thread CPU time for one thread, process CPU time for the batch), so
// they hold on a machine shared with other work; the batch's wall-clock rate is reported too.
int run_bench(const tokenizer::Tokenizer& tok, const TokenizeArgs& a) {
  const auto docs = read_corpus(a.bench);
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  double one_cpu = 1e30, one_wall = 1e30, batch_wall = 1e30, batch_cpu = 1e30;
  size_t tokens = 0;
  ThreadPool pool(a.threads);
  using Clock = std::chrono::steady_clock;
  for (int r = 0; r < std::max(1, a.repeat); ++r) {
    auto w0 = Clock::now();
    double c0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    tokens = 0;
    for (const auto& d : docs) tokens += tok.encode(d).size();
    one_cpu = std::min(one_cpu, cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - c0);
    one_wall = std::min(one_wall, std::chrono::duration<double>(Clock::now() - w0).count());
    w0 = Clock::now();
    c0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    const auto all = tok.encode_batch(docs, pool);
    batch_cpu = std::min(batch_cpu, cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - c0);
    batch_wall = std::min(batch_wall, std::chrono::duration<double>(Clock::now() - w0).count());
    size_t batch_tokens = 0;
    for (const auto& ids : all) batch_tokens += ids.size();
    DI_CHECK_INTERNAL(batch_tokens == tokens) << "batch and single-thread encode disagree";
  }
  const nlohmann::json out = {{"documents", docs.size()},
                              {"bytes", bytes},
                              {"tokens", tokens},
                              {"threads", pool.size()},
                              {"one_thread_mb_per_cpu_s", bytes / one_cpu / 1e6},
                              {"one_thread_mb_s", bytes / one_wall / 1e6},
                              {"batch_mb_s", bytes / batch_wall / 1e6},
                              {"batch_mb_per_cpu_s", bytes / batch_cpu / 1e6}};
  std::cout << out.dump() << "\n";
  return 0;
}

int run_tokenize(const TokenizeArgs& a) {
  std::string path = a.tokenizer;
  if (path.empty()) {
    DI_CHECK(!a.model.empty()) << "give --model DIR or --tokenizer tokenizer.json";
    path = (std::filesystem::path(a.model) / "tokenizer.json").string();
  }
  auto tok = tokenizer::Tokenizer::from_file(path);
  const auto mode = a.no_special ? tokenizer::SpecialTokenMode::kAllAsText : tokenizer::SpecialTokenMode::kRecognize;
  if (!a.chat.empty()) {
    auto j = nlohmann::ordered_json::parse(read_file(a.chat));
    tokenizer::ChatRequest req = tokenizer::parse_chat_request(j);
    if (!j.is_object() || !j.contains("thinking")) req.thinking = a.thinking;
    if (!a.reasoning_effort.empty()) req.reasoning_effort = a.reasoning_effort;
    auto prompt = tokenizer::render_chat(req, tokenizer::parse_chat_format(a.encoding));
    if (a.print_text) std::cout << prompt.text << "\n";
    print_ids(tokenizer::encode_prompt(*tok, prompt));
    return 0;
  }
  if (!a.bench.empty()) return run_bench(*tok, a);
  if (!a.decode.empty()) {
    std::cout << tok->decode(parse_id_list(a.decode), a.skip_special) << "\n";
    return 0;
  }
  if (!a.text.empty()) {
    print_ids(tok->encode(a.text, mode));
    return 0;
  }
  if (!a.file.empty()) {
    print_ids(tok->encode(read_file(a.file), mode));
    return 0;
  }
  // stdin: one line in, one array out (or one decoded line per id array with --decode -).
  std::string line;
  while (std::getline(std::cin, line)) print_ids(tok->encode(line, mode));
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app, CommandRegistry& reg) {
  auto a = std::make_shared<TokenizeArgs>();
  auto* sub = app.add_subcommand("tokenize", "encode text / decode ids / encode chat messages with tokenizer.json");
  sub->add_option("--model", a->model, "model directory holding tokenizer.json");
  sub->add_option("--tokenizer", a->tokenizer, "path of a tokenizer.json (instead of --model)");
  sub->add_option("--text", a->text, "text to encode (default: each stdin line)");
  sub->add_option("--file", a->file, "file whose whole contents to encode");
  sub->add_option("--decode", a->decode, "token ids to decode, e.g. 1,2,3 or [1, 2, 3]");
  sub->add_flag("--skip-special", a->skip_special, "decode: drop special tokens");
  sub->add_flag("--no-special", a->no_special, "encode special-token spellings as plain text");
  sub->add_option("--chat", a->chat, "JSON file: {\"messages\": [...], \"tools\": [...]} or a messages array");
  sub->add_option("--encoding", a->encoding, "chat encoding: v3, v31, v4, v41")->capture_default_str();
  sub->add_flag("--thinking", a->thinking, "chat: thinking mode (unless the file says \"thinking\")");
  sub->add_option("--reasoning-effort", a->reasoning_effort, "chat: low, high, xhigh, max");
  sub->add_flag("--print-text", a->print_text, "chat: print the rendered prompt before its ids");
  sub->add_option("--bench", a->bench, "corpus.bin of tools/tokenizer_reference.py: print encode MB/s");
  sub->add_option("--threads", a->threads, "--bench: threads of the batch encode (0: all cores)");
  sub->add_option("--repeat", a->repeat, "--bench: passes (the best one is reported)")->capture_default_str();
  reg.add(sub, [a] { return run_tokenize(*a); });
}

}  // namespace deepinfer::cli
