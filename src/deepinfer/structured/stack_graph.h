// The pushdown runtime over a CompiledGrammar: sets of parser stacks, hash-consed so that equal stacks and
// equal stack sets have equal ids, and so that every transition can be memoized.
//
// A *node* is one stack frame (global DFA state, parent node): a whole stack is identified by its top node.
// The parent of a frame holds the state to continue in after the frame's rule returns. Two sentinel parents
// end every stack:
//   kRoot   - below the root rule: popping into it means the input so far is a complete sentence;
//   kBottom - below a *detached* frame, used when precomputing token masks for one DFA state without knowing
//             the stacks underneath: popping into it means "this rule is done; what follows is up to the context".
// A *config* is a set of leaf nodes (frames whose state can consume a byte) plus the flags can_end/hit_bottom,
// i.e. everything the matcher needs to know after some input. Config 0 is the dead config (no way forward).
// All stacks reached without reading a byte (calls, returns) are expanded eagerly by closure(), which is
// memoized per node; step() is memoized per (config, byte). Nothing is ever freed: a StackGraph lives as long
// as one request (matcher) or one compiled grammar (mask cache).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/structured/compiled_grammar.h"

namespace deepinfer::structured {

class StackGraph {
 public:
  static constexpr uint32_t kRoot = 0;
  static constexpr uint32_t kBottom = 1;
  static constexpr uint32_t kDead = 0;

  explicit StackGraph(const CompiledGrammar* grammar);
  StackGraph(const StackGraph&) = delete;
  StackGraph& operator=(const StackGraph&) = delete;

  const CompiledGrammar& grammar() const { return *g_; }

  uint32_t start_config();
  // The config holding just the frame (state, kBottom); `state` must consume bytes (a leaf state).
  uint32_t detached_config(int32_t state);
  // Everything reachable from `node` without reading a byte.
  uint32_t closure(uint32_t node);
  uint32_t step(uint32_t config, uint8_t byte) {
    Config& c = configs_[config];
    if (c.next && c.next[byte] != kUnknown) return c.next[byte];
    return step_slow(config, byte);
  }
  uint32_t without_bottom(uint32_t config);
  // Byte sets (TokenTrie::byte_bucket bits) that let a trie walk take a whole subtree at once: when every byte below
  // a trie node lies in one of them, every token of the subtree keeps `config` alive and none reaches the bottom.
  // Words [0, 2): the bytes b with step(config, b) == config (the usual "inside a string" loop); words [2, 4): the
  // closed ASCII class of the leaf's DFA state (closed_class). Exact for a config of one leaf that is its own
  // closure; empty otherwise (conservative).
  const uint64_t* subtree_sets(uint32_t config) {
    if (config < loops_known_.size() && loops_known_[config]) return &loops_[static_cast<size_t>(config) * 4];
    return subtree_sets_slow(config);
  }
  // A set A of ASCII bytes (byte_bucket bits, 2 words; bucket 127 never) such that every state reachable from
  // `state` by bytes of A is clean (reads bytes, calls nothing, not accepting) and moves on every byte of A to
  // such a state again: any byte string over A keeps a frame in `state` alive, without a call or a return,
  // whatever lies below it. A pattern's or format's character class (`[a-z0-9-]+`, a URI's path characters) is
  // such a set, where the self-loop bytes of one DFA state are only part of it. Empty when `state` is not clean,
  // keeps fewer than kMinClassBytes bytes itself, or the search exceeds kMaxClassStates states or kMaxClassRounds
  // rounds. Memoized per state.
  const uint64_t* closed_class(int32_t state);
  static constexpr size_t kMaxClassStates = 128;
  static constexpr int kMaxClassRounds = 24;
  static constexpr int kMinClassBytes = 16;  // fewer printable ASCII bytes kept by the state itself: no class

  bool dead(uint32_t config) const { return config == kDead; }
  bool can_end(uint32_t config) const { return configs_[config].flags & kCanEnd; }
  bool hit_bottom(uint32_t config) const { return configs_[config].flags & kHitBottom; }
  const std::vector<uint32_t>& leaves(uint32_t config) const { return configs_[config].leaves; }
  int32_t node_state(uint32_t node) const { return nodes_[node].state; }
  uint32_t node_parent(uint32_t node) const { return nodes_[node].parent; }

  size_t num_nodes() const { return nodes_.size(); }
  size_t num_configs() const { return configs_.size(); }
  // A readable description of what a config expects next, for error messages.
  std::string describe(uint32_t config) const;

  // Guard against pathological ambiguity: a config with more leaves than this is an error (ResourceExhausted).
  static constexpr size_t kMaxLeaves = 20000;

 private:
  static constexpr uint32_t kUnknown = 0xFFFFFFFFu;
  static constexpr uint8_t kCanEnd = 1, kHitBottom = 2;
  struct Node {
    int32_t state;
    uint32_t parent;
  };
  struct Config {
    std::vector<uint32_t> leaves;  // sorted, unique
    uint8_t flags = 0;
    uint32_t* next = nullptr;  // 256 memoized successors from next_pool_, taken on the first step
  };

  uint32_t make_node(int32_t state, uint32_t parent);
  uint32_t intern(std::vector<uint32_t> leaves, uint8_t flags);
  uint32_t step_slow(uint32_t config, uint8_t byte);
  const uint64_t* subtree_sets_slow(uint32_t config);

  const CompiledGrammar* g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, uint32_t> node_ids_;
  std::vector<uint32_t> closure_;  // per node, kUnknown until computed
  std::vector<Config> configs_;
  std::unordered_map<std::string, uint32_t> config_ids_;
  std::vector<uint32_t> scratch_;
  // Successor tables in chunks: a trie walk makes hundreds of configs, and a heap block per table cost about as
  // much as the walk's other work per config.
  std::vector<std::unique_ptr<uint32_t[]>> next_pool_;
  size_t next_pool_used_ = 0;  // tables taken from the last chunk
  static constexpr size_t kTablesPerChunk = 64;
  std::vector<uint64_t> loops_;        // 4 words per config (subtree_sets)
  std::vector<uint8_t> loops_known_;   // per config
  std::vector<uint64_t> class_;        // 2 words per DFA state (closed_class)
  std::vector<uint8_t> class_known_;   // per DFA state
  std::vector<uint32_t> class_stamp_;  // per DFA state: in closed_class's current reachable set
  uint32_t stamp_ = 0;
  std::vector<int32_t> class_reach_;
};

}  // namespace deepinfer::structured
