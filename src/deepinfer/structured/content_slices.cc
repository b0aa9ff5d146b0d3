#include "deepinfer/structured/content_slices.h"

#include <algorithm>

#include "deepinfer/structured/vocabulary.h"

namespace deepinfer::structured {

const std::vector<std::pair<uint8_t, int8_t>>& ContentSliceAnalyzer::representatives(int rule, int utf8_state) {
  if (reps_.empty()) reps_.resize(graph_->grammar().num_rules() * kSliceUtf8States);
  auto& r = reps_[static_cast<size_t>(rule) * kSliceUtf8States + utf8_state];
  if (!r.empty()) return r;
  const CompiledGrammar& g = graph_->grammar();
  uint8_t tried[256 * kSliceUtf8States] = {};
  for (int b = 0; b < 256; ++b) {
    const int nu = slice_utf8_next(utf8_state, static_cast<uint8_t>(b));
    if (nu < 0) continue;
    uint8_t& t = tried[g.byte_class(rule, static_cast<uint8_t>(b)) * kSliceUtf8States + nu];
    if (t) continue;
    t = 1;
    r.emplace_back(static_cast<uint8_t>(b), static_cast<int8_t>(nu));
  }
  return r;
}

// Clean: reading into this state neither calls a rule nor may return, so the config after it is the one frame.
static bool clean_state(const CompiledGrammar& g, int32_t s) {
  return !g.state(s).accepting && g.calls_begin(s) == g.calls_end(s);
}

const ContentSliceAnalyzer::CharStep& ContentSliceAnalyzer::state_char_step(int32_t state) {
  if (state_steps_.empty()) state_steps_.resize(graph_->grammar().num_states());
  auto& slot = state_steps_[state];
  if (slot) return *slot;
  const CompiledGrammar& g = graph_->grammar();
  const int rule = g.state(state).rule;
  auto r = std::make_unique<CharStep>();
  // Scratch vectors (this is called for every state of a key automaton: thousands, each worth a few hundred ns).
  auto& frontier = step_frontier_;
  auto& seen = step_seen_;
  auto& next = step_next_;
  auto& callers = step_callers_;
  frontier.assign(1, {state, 0});
  seen.assign(1, {state, 0});
  next.clear();
  callers.clear();
  while (!frontier.empty() && !r->other_unknown) {
    const auto [s, u] = frontier.back();
    frontier.pop_back();
    for (const auto& [b, nu] : representatives(rule, u)) {
      const int32_t n = g.next(s, b);
      if (n < 0) {
        r->dies = true;
      } else if (!clean_state(g, n)) {
        r->unknown = true;  // the frame may return or call here: leave it to the config-level analysis
        if (nu == 0 && !g.state(n).accepting && !g.state(n).has_bytes) {
          callers.push_back(n);  // calls only (closed_from may see through it)
          continue;
        }
        r->other_unknown = true;
        break;
      } else if (nu == 0) {
        next.push_back(static_cast<uint32_t>(n));
      } else if (std::find(seen.begin(), seen.end(), std::make_pair(n, static_cast<int>(nu))) == seen.end()) {
        seen.emplace_back(n, nu);
        frontier.emplace_back(n, nu);
      }
    }
  }
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  r->next.assign(next.begin(), next.end());
  std::sort(callers.begin(), callers.end());
  callers.erase(std::unique(callers.begin(), callers.end()), callers.end());
  r->callers.assign(callers.begin(), callers.end());
  slot = std::move(r);
  return *slot;
}

const ContentSliceAnalyzer::CharStep& ContentSliceAnalyzer::config_char_step(uint32_t config) {
  auto it = config_steps_.find(config);
  if (it != config_steps_.end()) return it->second;
  CharStep r;
  const CompiledGrammar& g = graph_->grammar();
  // (config, UTF-8 state) pairs inside a character; a character ends when the UTF-8 state returns to 0.
  std::vector<std::pair<uint32_t, int>> frontier{{config, 0}}, seen{{config, 0}};
  std::vector<std::pair<uint8_t, int8_t>> all;
  while (!frontier.empty()) {
    const auto [c, u] = frontier.back();
    frontier.pop_back();
    // For a one-leaf config, step(c, b) depends on b only through the leaf rule's byte class; several leaves may
    // belong to several rules: try every byte.
    const std::vector<uint32_t>& leaves = graph_->leaves(c);
    const std::vector<std::pair<uint8_t, int8_t>>* bytes = &all;
    if (leaves.size() == 1) {
      bytes = &representatives(g.state(graph_->node_state(leaves[0])).rule, u);
    } else {
      all.clear();
      for (int b = 0; b < 256; ++b) {
        const int nu = slice_utf8_next(u, static_cast<uint8_t>(b));
        if (nu >= 0) all.emplace_back(static_cast<uint8_t>(b), static_cast<int8_t>(nu));
      }
    }
    for (const auto& [b, nu] : *bytes) {
      const uint32_t n = graph_->step(c, b);
      if (n == StackGraph::kDead) {
        r.dies = true;
        continue;
      }
      r.unknown |= graph_->hit_bottom(n);
      if (nu == 0) {
        r.next.push_back(n);
      } else if (std::find(seen.begin(), seen.end(), std::make_pair(n, static_cast<int>(nu))) == seen.end()) {
        seen.emplace_back(n, nu);
        frontier.emplace_back(n, nu);
      }
    }
  }
  std::sort(r.next.begin(), r.next.end());
  r.next.erase(std::unique(r.next.begin(), r.next.end()), r.next.end());
  ++config_steps_made_;
  return config_steps_.emplace(config, std::move(r)).first->second;
}

bool ContentSliceAnalyzer::closed_from(int32_t state, int depth) {
  const CompiledGrammar& g = graph_->grammar();
  if (state_closed_.empty()) state_closed_.resize(g.num_states(), 0);
  if (state_closed_[state] != 0) return state_closed_[state] == 1;  // known, or inside an enclosing walk: no
  const int8_t mark = static_cast<int8_t>(2 + depth);               // this walk's "visited, pending"
  // visited[i] was reached from visited[from[i]] (the search tree): a state that fails for sure fails every state
  // on its tree path too, which is what makes the positions of a long counted repetition (`maxLength: 32767`: a
  // chain of 32k states that dies at its end) one step each instead of a walk to the end of the chain each.
  std::vector<int32_t> visited{state}, frontier{0};
  std::vector<uint32_t> from{0};
  state_closed_[state] = mark;
  bool closed = true;
  int64_t failed_at = -1;  // index in visited of a state known not to be closed (-1: none, or not for sure)
  while (!frontier.empty() && closed) {
    const int32_t at = frontier.back();
    const int32_t s = visited[at];
    frontier.pop_back();
    const CharStep& st = state_char_step(s);
    if (st.dies || st.other_unknown) {
      closed = false;
      failed_at = at;
      break;
    }
    // A state that only calls: the run goes on in the callees, which never return on slice characters when their
    // start states are clean and closed - so the caller's continuation is never reached by a run.
    for (int32_t c : st.callers) {
      for (const auto* call = g.calls_begin(c); call != g.calls_end(c) && closed; ++call) {
        const int32_t start = g.rule_start(call->rule);
        closed = depth < 3 && clean_state(g, start) && closed_from(start, depth + 1);
      }
      if (!closed) break;
    }
    if (!closed) break;
    for (uint32_t n : st.next) {
      const int8_t known = state_closed_[n];
      if (known == 1 || known == mark) continue;  // closed already, or in this walk
      if (known != 0) {                           // known not closed, or pending in an enclosing walk
        closed = false;
        if (known == -1) failed_at = at;
        break;
      }
      state_closed_[n] = mark;
      frontier.push_back(static_cast<int32_t>(visited.size()));
      from.push_back(static_cast<uint32_t>(at));
      visited.push_back(static_cast<int32_t>(n));
    }
  }
  // Success: every visited state's reachable set lies inside this closed one (callees included). Failure says
  // nothing about the other visited states (they may not reach the failing one), nor, inside an enclosing walk,
  // about this one - except for the tree path to a state that fails for sure.
  if (closed) {
    for (int32_t v : visited) state_closed_[v] = 1;
    return true;
  }
  if (failed_at >= 0)
    for (int64_t i = failed_at;; i = from[i]) {
      state_closed_[visited[i]] = -1;
      if (i == 0) break;
    }
  for (int32_t v : visited)
    if (state_closed_[v] == mark) state_closed_[v] = 0;
  if (depth == 0) state_closed_[state] = -1;
  return false;
}

template <typename StepFn>
SliceBounds ContentSliceAnalyzer::levels(uint32_t start, StepFn&& step, bool* gave_up) {
  SliceBounds sb;
  bool alive_known = false;  // S found
  std::vector<uint32_t> level{start}, next;
  uint32_t k = 0;  // characters read to reach `level`
  for (;; ++k) {
    if (k >= max_chars_) break;  // every examined length is alive: S = max_chars (or what was found)
    bool dies = false, unknown = false;
    next.clear();
    for (uint32_t c : level) {
      const CharStep* s = step(c);
      if (s == nullptr) {  // over budget
        *gave_up = true;
        unknown = true;
        break;
      }
      dies |= s->dies;
      unknown |= s->unknown;
      next.insert(next.end(), s->next.begin(), s->next.end());
    }
    if (unknown && *gave_up) break;
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    if ((dies || unknown) && !alive_known) {
      sb.all_alive = k;
      alive_known = true;
    }
    // Past a return (or what the state-level view cannot follow) tokens go on in an unknown context: nothing is
    // known to be dead.
    if (unknown) break;
    if (next.empty()) {
      sb.all_dead = k + 1;
      break;
    }
    if (next == level) {  // the same set forever: nothing new dies past here
      if (!alive_known) {
        sb.all_alive = max_chars_;
        alive_known = true;
      }
      break;
    }
    if (next.size() > kMaxLevelSize) break;
    // Past S, the levels only look for D: worth it while they stay small (bounded strings and fixed-length
    // patterns: one state per position); a pattern whose runs branch out (a URI) would cost up to 32 sorted levels
    // of thousands of states for a D that the walk's dead subtrees mostly give anyway.
    if (alive_known && next.size() > kMaxDeadSearchLevel) break;
    level.swap(next);
  }
  if (!alive_known) sb.all_alive = std::min(k, max_chars_);
  return sb;
}

SliceBounds ContentSliceAnalyzer::bounds(uint32_t config) {
  auto it = bounds_.find(config);
  if (it != bounds_.end()) return it->second;
  SliceBounds sb;
  const std::vector<uint32_t>& leaves = graph_->leaves(config);
  bool done = false;
  if (leaves.size() == 1 && graph_->node_parent(leaves[0]) == StackGraph::kBottom && !graph_->hit_bottom(config) &&
      !graph_->can_end(config)) {
    // A detached frame: while every state reached is clean, configs are single frames over DFA states, and the
    // analysis runs on the rule's DFA alone (no configs made). One "unknown" step sends it to the config level.
    const int32_t root = graph_->node_state(leaves[0]);
    if (closed_from(root)) {
      sb.all_alive = max_chars_;
      bounds_.emplace(config, sb);
      return sb;
    }
    bool any_unknown = false, unused = false;
    auto by_state = [&](uint32_t s) {
      const CharStep* st = &state_char_step(static_cast<int32_t>(s));
      any_unknown |= st->unknown;
      return st;
    };
    sb = levels(static_cast<uint32_t>(root), by_state, &unused);
    done = !any_unknown;
  }
  if (!done) {
    // Config level, where each level costs closures: when the first character already refuses some run (S = 0,
    // object and array punctuation), the levels would only look for D, which the walk's dead-subtree skipping
    // mostly gets anyway; stop there unless every run dies at once (D = 1).
    const CharStep& first = config_char_step(config);
    if (first.dies || first.unknown) {
      sb.all_alive = 0;
      if (first.next.empty() && !first.unknown) sb.all_dead = 1;
      bounds_.emplace(config, sb);
      return sb;
    }
    const size_t budget_end = config_steps_made_ + kMaxConfigSteps;
    bool gave_up = false;
    auto by_config = [&](uint32_t c) -> const CharStep* {
      if (config_steps_.find(c) == config_steps_.end() && config_steps_made_ >= budget_end) return nullptr;
      return &config_char_step(c);
    };
    sb = levels(config, by_config, &gave_up);
  }
  bounds_.emplace(config, sb);
  return sb;
}

}  // namespace deepinfer::structured
