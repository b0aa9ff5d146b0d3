#include "deepinfer/structured/stack_graph.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "deepinfer/core/error.h"

namespace deepinfer::structured {

StackGraph::StackGraph(const CompiledGrammar* grammar) : g_(grammar) {
  nodes_.push_back(Node{-1, kRoot});    // kRoot
  nodes_.push_back(Node{-1, kBottom});  // kBottom
  closure_.assign(2, kUnknown);
  configs_.emplace_back();  // kDead
  config_ids_.emplace(std::string(1, '\0'), kDead);
  closure_[kRoot] = intern({}, kCanEnd);
  closure_[kBottom] = intern({}, kHitBottom);
}

uint32_t StackGraph::make_node(int32_t state, uint32_t parent) {
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | parent;
  auto [it, inserted] = node_ids_.emplace(key, static_cast<uint32_t>(nodes_.size()));
  if (inserted) {
    nodes_.push_back(Node{state, parent});
    closure_.push_back(kUnknown);
  }
  return it->second;
}

uint32_t StackGraph::intern(std::vector<uint32_t> leaves, uint8_t flags) {
  std::string key(1 + leaves.size() * sizeof(uint32_t), '\0');
  key[0] = static_cast<char>(flags);
  if (!leaves.empty()) std::memcpy(key.data() + 1, leaves.data(), leaves.size() * sizeof(uint32_t));
  auto [it, inserted] = config_ids_.emplace(std::move(key), static_cast<uint32_t>(configs_.size()));
  if (inserted) {
    Config c;
    c.leaves = std::move(leaves);
    c.flags = flags;
    configs_.push_back(std::move(c));
  }
  return it->second;
}

uint32_t StackGraph::start_config() { return closure(make_node(g_->rule_start(g_->root_rule()), kRoot)); }

uint32_t StackGraph::detached_config(int32_t state) {
  DI_CHECK_INTERNAL(g_->state(state).has_bytes) << "detached_config of a state that reads no byte";
  return intern({make_node(state, kBottom)}, 0);
}

uint32_t StackGraph::closure(uint32_t node) {
  if (closure_[node] != kUnknown) return closure_[node];
  {
    // The common frame (inside a rule: no call, not accepting) is its own closure; skip the general search.
    const int32_t s = nodes_[node].state;
    if (!g_->state(s).accepting && g_->calls_begin(s) == g_->calls_end(s)) {
      const uint32_t id = g_->state(s).has_bytes ? intern({node}, 0) : intern({}, 0);
      closure_[node] = id;
      return id;
    }
  }
  std::vector<uint32_t> leaves;
  uint8_t flags = 0;
  std::unordered_set<uint32_t> visited;
  std::vector<uint32_t> stack{node};
  while (!stack.empty()) {
    uint32_t x = stack.back();
    stack.pop_back();
    if (!visited.insert(x).second) continue;
    if (x != node && closure_[x] != kUnknown) {
      // A frame below us whose expansion is already known (typically the parent after a return).
      const Config& c = configs_[closure_[x]];
      leaves.insert(leaves.end(), c.leaves.begin(), c.leaves.end());
      flags |= c.flags;
      continue;
    }
    if (x == kRoot) {
      flags |= kCanEnd;
      continue;
    }
    if (x == kBottom) {
      flags |= kHitBottom;
      continue;
    }
    const int32_t s = nodes_[x].state;
    const uint32_t parent = nodes_[x].parent;
    const auto& st = g_->state(s);
    if (st.has_bytes) leaves.push_back(x);
    for (const auto* c = g_->calls_begin(s); c != g_->calls_end(s); ++c) {
      uint32_t ret = make_node(c->target, parent);
      stack.push_back(make_node(g_->rule_start(c->rule), ret));
    }
    if (st.accepting) stack.push_back(parent);
    DI_CHECK_CODE(visited.size() < 4 * kMaxLeaves, ErrorCode::kResourceExhausted)
        << "grammar expansion too large (highly ambiguous grammar?)";
  }
  std::sort(leaves.begin(), leaves.end());
  leaves.erase(std::unique(leaves.begin(), leaves.end()), leaves.end());
  uint32_t id = intern(std::move(leaves), flags);
  closure_[node] = id;
  return id;
}

uint32_t StackGraph::step_slow(uint32_t config, uint8_t byte) {
  uint32_t result;
  {
    const std::vector<uint32_t>& leaves = configs_[config].leaves;
    if (leaves.size() == 1) {
      uint32_t leaf = leaves[0];
      int32_t t = g_->next(nodes_[leaf].state, byte);
      result = t < 0 ? kDead : closure(make_node(t, nodes_[leaf].parent));
    } else {
      std::vector<uint32_t> merged;
      uint8_t flags = 0;
      uint32_t single = kDead;
      int parts = 0;
      for (size_t i = 0; i < configs_[config].leaves.size(); ++i) {
        uint32_t leaf = configs_[config].leaves[i];
        int32_t t = g_->next(nodes_[leaf].state, byte);
        if (t < 0) continue;
        uint32_t c = closure(make_node(t, nodes_[leaf].parent));
        if (c == kDead || c == single) continue;
        single = c;
        ++parts;
        merged.insert(merged.end(), configs_[c].leaves.begin(), configs_[c].leaves.end());
        flags |= configs_[c].flags;
      }
      if (parts <= 1) {
        result = single;
      } else {
        std::sort(merged.begin(), merged.end());
        merged.erase(std::unique(merged.begin(), merged.end()), merged.end());
        DI_CHECK_CODE(merged.size() <= kMaxLeaves, ErrorCode::kResourceExhausted)
            << "more than " << kMaxLeaves << " parser stacks alive (highly ambiguous grammar)";
        result = intern(std::move(merged), flags);
      }
    }
  }
  Config& c = configs_[config];
  if (!c.next) {
    if (next_pool_.empty() || next_pool_used_ == kTablesPerChunk) {
      next_pool_.push_back(std::make_unique<uint32_t[]>(256 * kTablesPerChunk));
      next_pool_used_ = 0;
    }
    c.next = next_pool_.back().get() + 256 * next_pool_used_++;
    std::fill(c.next, c.next + 256, kUnknown);
  }
  c.next[byte] = result;
  return result;
}

const uint64_t* StackGraph::subtree_sets_slow(uint32_t config) {
  uint64_t bits[4] = {0, 0, 0, 0};
  if (configs_[config].leaves.size() == 1) {
    const uint32_t leaf = configs_[config].leaves[0];
    // step(config, b) = closure((next(s, b), parent)); when next(s, b) == s that is closure(leaf), which is this
    // config exactly when the config is the leaf's own closure.
    if (closure(leaf) == config) {
      const int32_t s = nodes_[leaf].state;
      bool high = true;  // bucket 127: byte 127 and every non-ASCII byte
      for (int b = 0; b < 256; ++b) {
        const bool loops = g_->next(s, static_cast<uint8_t>(b)) == s;
        if (b < 127) {
          if (loops) bits[b >> 6] |= uint64_t{1} << (b & 63);
        } else {
          high &= loops;
        }
      }
      if (high) bits[1] |= uint64_t{1} << 63;
      // The class of a clean state: its frames never look at the parent while reading bytes of the class.
      const uint64_t* cls = closed_class(s);
      bits[2] = cls[0];
      bits[3] = cls[1];
    }
  }
  if (loops_known_.size() < configs_.size()) {
    loops_known_.resize(configs_.size(), 0);
    loops_.resize(configs_.size() * 4, 0);
  }
  std::copy(bits, bits + 4, &loops_[static_cast<size_t>(config) * 4]);
  loops_known_[config] = 1;
  return &loops_[static_cast<size_t>(config) * 4];
}

const uint64_t* StackGraph::closed_class(int32_t state) {
  if (class_known_.empty()) {
    class_known_.assign(g_->num_states(), 0);
    class_.assign(g_->num_states() * 2, 0);
  }
  uint64_t* out = &class_[static_cast<size_t>(state) * 2];
  if (class_known_[state]) return out;
  class_known_[state] = 1;
  auto clean = [&](int32_t s) {
    const auto& st = g_->state(s);
    return st.has_bytes && !st.accepting && g_->calls_begin(s) == g_->calls_end(s);
  };
  if (!clean(state)) return out;
  // Work on the rule's byte classes: one representative byte per class (next() depends only on the class), among
  // the printable ASCII bytes but '"' and '\\' (in a JSON string they end it or start an escape, whose states
  // refuse nearly everything: they would only shrink the class).
  const int rule = g_->state(state).rule;
  std::vector<uint8_t> reps;
  {
    bool seen[256] = {};
    for (int b = 0x20; b < 0x7F; ++b) {
      const uint8_t c = g_->byte_class(rule, static_cast<uint8_t>(b));
      if (b != '"' && b != '\\' && !seen[c]) {
        seen[c] = true;
        reps.push_back(static_cast<uint8_t>(b));
      }
    }
  }
  // A state that keeps only a few bytes (a name's next letters, a number's digits) would only get a class that
  // few subtrees lie in, for rounds of searching: skip it.
  {
    int kept_bytes = 0;
    for (int b = 0x20; b < 0x7F; ++b) {
      const int32_t t = g_->next(state, static_cast<uint8_t>(b));
      kept_bytes += t >= 0 && clean(t);
    }
    if (kept_bytes < kMinClassBytes) return out;
  }
  // Rounds: search the states reachable with the remaining classes in BFS order; at the first state that refuses
  // some class (dies, or reaches a state that is not clean), drop the refused classes if it is `state` itself, else
  // the class of the edge that reached it (`%` into a URI's percent-escape state, which refuses all but hex
  // digits: dropping the digits instead would leave little). Each round drops a class, so the result is closed when
  // a round finds nothing to drop; it need not be the largest such set.
  std::vector<int32_t>& reach = class_reach_;
  std::vector<int32_t> via;  // index in reps of the edge that first reached reach[i]
  std::vector<uint8_t> drop;
  if (class_stamp_.size() != g_->num_states()) class_stamp_.assign(g_->num_states(), 0);
  for (int round = 0; !reps.empty(); ++round) {
    if (round == kMaxClassRounds) return out;
    ++stamp_;
    reach.assign(1, state);
    via.assign(1, -1);
    class_stamp_[state] = stamp_;
    drop.assign(reps.size(), 0);
    bool dropping = false;
    for (size_t i = 0; i < reach.size() && !dropping; ++i) {
      for (size_t k = 0; k < reps.size(); ++k) {
        const int32_t t = g_->next(reach[i], reps[k]);
        if (t < 0 || !clean(t)) {
          dropping = true;
          if (i == 0) {
            drop[k] = 1;
            continue;
          }
          drop[via[i]] = 1;
          break;
        }
        if (class_stamp_[t] != stamp_) {
          class_stamp_[t] = stamp_;
          reach.push_back(t);
          via.push_back(static_cast<int32_t>(k));
          if (reach.size() > kMaxClassStates) {
            // Give up, for the states seen too (their own sets are likely as large): bounds the work per state of
            // the grammar, where a chain (a long counted repetition) would otherwise search again from every
            // position.
            for (int32_t r : reach) class_known_[r] = 1;
            return out;
          }
        }
      }
    }
    if (!dropping) break;
    size_t kept = 0;
    for (size_t k = 0; k < reps.size(); ++k)
      if (!drop[k]) reps[kept++] = reps[k];
    reps.resize(kept);
  }
  if (reps.empty()) return out;
  std::vector<uint8_t> classes;
  for (uint8_t b : reps) classes.push_back(g_->byte_class(rule, b));
  for (int b = 0; b < 127; ++b)
    if (std::find(classes.begin(), classes.end(), g_->byte_class(rule, static_cast<uint8_t>(b))) != classes.end())
      out[b >> 6] |= uint64_t{1} << (b & 63);
  // Every state of the final reachable set has the same property with the same bytes (its own reachable set is a
  // subset): remember it for them too.
  for (int32_t r : reach) {
    if (class_known_[r]) continue;
    class_known_[r] = 1;
    class_[static_cast<size_t>(r) * 2] = out[0];
    class_[static_cast<size_t>(r) * 2 + 1] = out[1];
  }
  return out;
}

uint32_t StackGraph::without_bottom(uint32_t config) {
  const Config& c = configs_[config];
  if (!(c.flags & kHitBottom)) return config;
  std::vector<uint32_t> leaves = c.leaves;
  return intern(std::move(leaves), static_cast<uint8_t>(c.flags & ~kHitBottom));
}

std::string StackGraph::describe(uint32_t config) const {
  const Config& c = configs_[config];
  std::string out;
  if (c.flags & kCanEnd) out += "<end>";
  for (size_t i = 0; i < c.leaves.size() && i < 8; ++i) {
    int32_t s = nodes_[c.leaves[i]].state;
    if (!out.empty()) out += " | ";
    out += g_->rule_name(g_->state(s).rule) + ": " + g_->describe_expected(s);
  }
  if (c.leaves.size() > 8) out += " | ...";
  return out;
}

}  // namespace deepinfer::structured
