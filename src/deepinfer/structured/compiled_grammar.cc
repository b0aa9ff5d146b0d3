#include "deepinfer/structured/compiled_grammar.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <unordered_map>

#include "deepinfer/core/error.h"
#include "deepinfer/structured/dfa_minimize.h"

namespace deepinfer::structured {
namespace {

struct RuleDfa;
RuleDfa determinize(const Expr& body, int num_rules, const CompileLimits& limits, int dfa_budget,
                    const std::vector<int>* rule_map = nullptr);

// Thompson NFA of one rule body.
struct Nfa {
  std::vector<std::vector<int>> eps;
  std::vector<std::vector<std::pair<int, int>>> byte_edges;  // (index into sets, target)
  std::vector<std::vector<std::pair<int, int>>> call_edges;  // (rule, target)
  std::vector<ByteSet> sets;
  int limit = 0;
  const CompileLimits* limits = nullptr;
  int dfa_budget = 0;
  const std::vector<int>* rule_map = nullptr;  // references to rule r call (*rule_map)[r] (rule_representatives)

  int add_state() {
    DI_CHECK_CODE(static_cast<int>(eps.size()) < limit, ErrorCode::kResourceExhausted)
        << "grammar rule is too large (more than " << limit << " automaton states; large {m,n} repetitions?)";
    eps.emplace_back();
    byte_edges.emplace_back();
    call_edges.emplace_back();
    return static_cast<int>(eps.size()) - 1;
  }
  int set_id(const ByteSet& s) {
    for (size_t i = 0; i < sets.size(); ++i)
      if (sets[i] == s) return static_cast<int>(i);
    sets.push_back(s);
    return static_cast<int>(sets.size()) - 1;
  }
  // Adds paths s -> t for e. Only adds edges leaving s, entering t, or between fresh states, so alternatives may
  // share s and t safely.
  void build(const Expr& e, int s, int t, int num_rules) {
    switch (e.kind) {
      case ExprKind::kEmpty:
        eps[s].push_back(t);
        return;
      case ExprKind::kBytes:
        byte_edges[s].emplace_back(set_id(e.bytes), t);
        return;
      case ExprKind::kRule:
        DI_CHECK(e.rule >= 0 && e.rule < num_rules) << "reference to an unknown grammar rule " << e.rule;
        call_edges[s].emplace_back(rule_map != nullptr ? (*rule_map)[e.rule] : e.rule, t);
        return;
      case ExprKind::kAlt:
        for (const auto& c : e.children) build(*c, s, t, num_rules);
        return;
      case ExprKind::kSeq: {
        int cur = s;
        for (size_t i = 0; i < e.children.size(); ++i) {
          int nxt = i + 1 == e.children.size() ? t : add_state();
          build(*e.children[i], cur, nxt, num_rules);
          cur = nxt;
        }
        return;
      }
      case ExprKind::kAnd:
        build_intersection(e, s, t, num_rules);
        return;
      case ExprKind::kRepeat: {
        const Expr& c = *e.children[0];
        int cur = s;
        for (int i = 0; i < e.min; ++i) {
          int nxt = add_state();
          build(c, cur, nxt, num_rules);
          cur = nxt;
        }
        if (e.max == Expr::kUnbounded) {
          int loop = add_state(), back = add_state();
          eps[cur].push_back(loop);
          build(c, loop, back, num_rules);
          eps[back].push_back(loop);
          eps[loop].push_back(t);
        } else {
          for (int i = e.min; i < e.max; ++i) {
            eps[cur].push_back(t);
            int nxt = i + 1 == e.max ? t : add_state();
            build(c, cur, nxt, num_rules);
            cur = nxt;
          }
          if (e.max == e.min) eps[cur].push_back(t);
        }
        return;
      }
    }
  }
  // Product of the operands' DFAs, laid out as fresh NFA states between s and t.
  void build_intersection(const Expr& e, int s, int t, int num_rules);
};

void eps_closure(const Nfa& nfa, std::vector<int>& set, std::vector<char>& seen) {
  std::vector<int> stack(set.begin(), set.end());
  for (int s : set) seen[s] = 1;
  while (!stack.empty()) {
    int s = stack.back();
    stack.pop_back();
    for (int t : nfa.eps[s])
      if (!seen[t]) {
        seen[t] = 1;
        set.push_back(t);
        stack.push_back(t);
      }
  }
  for (int s : set) seen[s] = 0;
  std::sort(set.begin(), set.end());
}

struct RuleDfa {
  std::vector<std::vector<int32_t>> trans;              // per state, per class; local ids
  std::vector<std::vector<std::pair<int, int>>> calls;  // (rule, local target)
  std::vector<bool> accepting;
  std::vector<uint8_t> byte_class;  // 256
  int num_classes = 0;
};

// Merges the states with equal futures (dfa_minimize.h says why); a call of rule r is the letter
// num_classes + r. The start stays state 0. Rules of more than kMaxMinimizedStates states are left as they are:
// those are long counted repetitions (`maxLength: 32767`: 819k states), where minimization halves the states
// but adds ~0.35 s to a compile that is already the documented counted-repetition limit.
constexpr int32_t kMaxMinimizedStates = 1 << 16;
void minimize(RuleDfa& dfa) {
  const int32_t n = static_cast<int32_t>(dfa.trans.size());
  if (n <= 1 || n > kMaxMinimizedStates) return;
  std::vector<DfaEdge> edges;
  std::vector<uint8_t> accepting(n);
  for (int32_t s = 0; s < n; ++s) {
    accepting[s] = dfa.accepting[s] ? 1 : 0;
    for (int32_t c = 0; c < dfa.num_classes; ++c)
      if (dfa.trans[s][c] >= 0) edges.push_back(DfaEdge{s, c, dfa.trans[s][c]});
    for (auto [rule, t] : dfa.calls[s]) edges.push_back(DfaEdge{s, dfa.num_classes + rule, t});
  }
  const std::vector<int32_t> block = minimize_dfa(n, accepting, edges);
  const int32_t blocks = *std::max_element(block.begin(), block.end()) + 1;
  if (blocks == n) return;
  RuleDfa out;
  out.byte_class = std::move(dfa.byte_class);
  out.num_classes = dfa.num_classes;
  out.trans.resize(blocks);
  out.calls.resize(blocks);
  out.accepting.resize(blocks);
  std::vector<char> done(blocks, 0);
  for (int32_t s = 0; s < n; ++s) {
    const int32_t b = block[s];
    if (done[b]) continue;  // every state of a block has the same moves up to blocks
    done[b] = 1;
    std::vector<int32_t>& row = out.trans[b];
    row = std::move(dfa.trans[s]);
    for (int32_t& t : row)
      if (t >= 0) t = block[t];
    out.calls[b] = std::move(dfa.calls[s]);
    for (auto& call : out.calls[b]) call.second = block[call.second];
    out.accepting[b] = dfa.accepting[s];
  }
  dfa = std::move(out);
}

RuleDfa determinize(const Expr& body, int num_rules, const CompileLimits& limits, int dfa_budget,
                    const std::vector<int>* rule_map) {
  Nfa nfa;
  nfa.rule_map = rule_map;
  nfa.limit = limits.max_nfa_states_per_rule;
  nfa.limits = &limits;
  nfa.dfa_budget = dfa_budget;
  int start = nfa.add_state(), final_state = nfa.add_state();
  nfa.build(body, start, final_state, num_rules);

  RuleDfa dfa;
  // Byte classes: bytes that belong to exactly the same edge sets behave identically in this rule.
  // Partition refinement, one edge set at a time (no per-byte signature vectors: a rule of a few states is
  // compiled in microseconds, and JSON Schema objects in any key order make thousands of them); classes are then
  // numbered by their first byte, as a signature map in byte order would number them.
  std::array<int, 256> cls{};
  int num = 1;
  std::array<int, 512> split;
  for (const ByteSet& set : nfa.sets) {
    std::fill(split.begin(), split.begin() + 2 * num, -1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      int& slot = split[2 * cls[b] + (set.test(static_cast<uint8_t>(b)) ? 1 : 0)];
      if (slot < 0) slot = next++;
      cls[b] = slot;
    }
    num = next;
  }
  dfa.byte_class.assign(256, 0);
  std::vector<int> renumber(num, -1), representative;
  for (int b = 0; b < 256; ++b) {
    if (renumber[cls[b]] < 0) {
      renumber[cls[b]] = static_cast<int>(representative.size());
      representative.push_back(b);
    }
    dfa.byte_class[b] = static_cast<uint8_t>(renumber[cls[b]]);
  }
  dfa.num_classes = static_cast<int>(representative.size());

  // Classes each edge set covers, so a DFA state's moves are computed in one pass over its NFA states.
  std::vector<std::vector<int>> set_classes(nfa.sets.size());
  for (size_t i = 0; i < nfa.sets.size(); ++i)
    for (int c = 0; c < dfa.num_classes; ++c)
      if (nfa.sets[i].test(static_cast<uint8_t>(representative[c]))) set_classes[i].push_back(c);

  struct VecHash {
    size_t operator()(const std::vector<int>& v) const {
      size_t h = v.size();
      for (int x : v) h = h * 1000003u ^ static_cast<size_t>(x);
      return h;
    }
  };
  std::vector<char> seen(nfa.eps.size(), 0);
  std::unordered_map<std::vector<int>, int, VecHash> ids;
  std::vector<std::vector<int>> sets;
  auto intern = [&](std::vector<int> set) -> int {
    if (set.empty()) return -1;
    eps_closure(nfa, set, seen);
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    DI_CHECK_CODE(static_cast<int>(sets.size()) < dfa_budget, ErrorCode::kResourceExhausted)
        << "grammar automaton exceeds " << limits.max_dfa_states << " states";
    int id = static_cast<int>(sets.size());
    ids.emplace(set, id);
    sets.push_back(std::move(set));
    return id;
  };
  intern({start});
  std::vector<std::vector<int>> buckets(dfa.num_classes);
  for (size_t d = 0; d < sets.size(); ++d) {
    for (auto& b : buckets) b.clear();
    for (int s : sets[d])
      for (auto [set, t] : nfa.byte_edges[s])
        for (int c : set_classes[set]) buckets[c].push_back(t);
    std::vector<int32_t> row(dfa.num_classes, -1);
    for (int c = 0; c < dfa.num_classes; ++c) {
      if (buckets[c].empty()) continue;
      std::vector<int> move = buckets[c];
      std::sort(move.begin(), move.end());
      move.erase(std::unique(move.begin(), move.end()), move.end());
      row[c] = intern(std::move(move));
    }
    std::map<int, std::vector<int>> by_rule;
    for (int s : sets[d])
      for (auto [rule, t] : nfa.call_edges[s]) by_rule[rule].push_back(t);
    std::vector<std::pair<int, int>> calls;
    for (auto& [rule, targets] : by_rule) {
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      calls.emplace_back(rule, intern(std::move(targets)));
    }
    dfa.trans.push_back(std::move(row));
    dfa.calls.push_back(std::move(calls));
    dfa.accepting.push_back(std::binary_search(sets[d].begin(), sets[d].end(), final_state));
  }
  minimize(dfa);
  return dfa;
}

void Nfa::build_intersection(const Expr& e, int s, int t, int num_rules) {
  std::vector<RuleDfa> parts;
  for (const auto& c : e.children) {
    parts.push_back(determinize(*c, num_rules, *limits, dfa_budget));
    for (const auto& calls : parts.back().calls)
      DI_CHECK_CODE(calls.empty(), ErrorCode::kUnsupported)
          << "grammar: an intersection operand refers to a rule (only regular operands are supported)";
  }
  struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const {
      size_t h = v.size();
      for (int32_t x : v) h = h * 1000003u ^ static_cast<size_t>(x);
      return h;
    }
  };
  std::unordered_map<std::vector<int32_t>, int, VecHash> ids;
  std::vector<std::vector<int32_t>> tuples;
  auto id_of = [&](std::vector<int32_t> tuple) {
    auto [it, inserted] = ids.emplace(tuple, 0);
    if (inserted) {
      DI_CHECK_CODE(static_cast<int>(tuples.size()) < dfa_budget, ErrorCode::kResourceExhausted)
          << "grammar intersection exceeds " << limits->max_dfa_states << " states";
      it->second = add_state();
      tuples.push_back(std::move(tuple));
    }
    return it->second;
  };
  const int start = id_of(std::vector<int32_t>(parts.size(), 0));  // (before indexing eps: it may grow)
  eps[s].push_back(start);
  std::vector<std::pair<std::vector<int32_t>, ByteSet>> moves;
  for (size_t i = 0; i < tuples.size(); ++i) {
    const int from = ids.at(tuples[i]);
    bool accepting = true;
    for (size_t p = 0; p < parts.size(); ++p) accepting &= static_cast<bool>(parts[p].accepting[tuples[i][p]]);
    if (accepting) eps[from].push_back(t);
    moves.clear();
    for (int b = 0; b < 256; ++b) {
      std::vector<int32_t> next(parts.size());
      bool live = true;
      for (size_t p = 0; p < parts.size() && live; ++p) {
        next[p] = parts[p].trans[tuples[i][p]][parts[p].byte_class[b]];
        live = next[p] >= 0;
      }
      if (!live) continue;
      auto it = std::find_if(moves.begin(), moves.end(), [&](const auto& m) { return m.first == next; });
      if (it == moves.end()) it = moves.insert(moves.end(), {std::move(next), ByteSet{}});
      it->second.set(static_cast<uint8_t>(b));
    }
    for (auto& [next, bytes] : moves) {
      const int to = id_of(next);  // may grow the state vectors: index again below
      byte_edges[from].emplace_back(set_id(bytes), to);
    }
  }
}

// Structurally equal rules: for each rule, the rule that stands for it (itself when it has no earlier equal).
// Front ends copy subschemas per branch - each anyOf / oneOf branch merged with its parent gets its own array,
// object and string rules - and copies of one rule would each pay their own trie walks for the same masks (their
// DFA states differ), where one rule's states share the mask entries. Two rules are equal when their bodies are
// the same expression tree with references to equal rules; rounds map references to their representatives, so
// equal rules that call equal copies are found in the next round (recursive copies never are: a conservative
// answer, the rules just stay apart). The root stands for its class, so it keeps its name in messages.
std::vector<int> rule_representatives(const Grammar& grammar) {
  const auto& rules = grammar.rules();
  const int n = static_cast<int>(rules.size());
  std::vector<int> rep(n);
  for (int r = 0; r < n; ++r) rep[r] = r;
  std::vector<int> order;  // the root first: it becomes its class's representative
  order.push_back(grammar.root());
  for (int r = 0; r < n; ++r)
    if (r != grammar.root()) order.push_back(r);
  // Rules of different shapes (the body hashed with every reference alike) are never equal, whatever the rounds
  // decide about the rules they call: only rules that share a shape with another one take part.
  std::unordered_map<const Expr*, uint64_t> shapes;
  auto shape_of = [&](auto&& self, const Expr& e) -> uint64_t {
    auto mix = [](uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001B3ull + (h >> 29); };
    uint64_t h = mix(0xCBF29CE484222325ull, static_cast<uint64_t>(e.kind));
    if (e.kind == ExprKind::kBytes)
      for (uint64_t w : e.bytes.words()) h = mix(h, w);
    if (e.children.empty()) return h;  // leaves: cheaper to hash again than to memoize
    if (auto it = shapes.find(&e); it != shapes.end()) return it->second;
    if (e.kind == ExprKind::kRepeat) h = mix(mix(h, static_cast<uint32_t>(e.min)), static_cast<uint32_t>(e.max));
    for (const auto& c : e.children) h = mix(h, self(self, *c));
    shapes.emplace(&e, h);
    return h;
  };
  std::unordered_map<uint64_t, int> shape_count;
  std::vector<uint64_t> rule_shape(n);
  for (int r = 0; r < n; ++r) ++shape_count[rule_shape[r] = shape_of(shape_of, *rules[r].body)];
  std::vector<int> candidates;
  for (int r : order)
    if (shape_count[rule_shape[r]] > 1) candidates.push_back(r);
  if (candidates.empty()) return rep;
  // Hash-consing: equal subtrees get equal ids. Expressions are DAGs: ids are memoized per node - for the whole
  // computation where no rule is referenced below (`fixed`), per round where one is (its id follows `rep`).
  std::unordered_map<const Expr*, uint32_t> fixed, memo;
  std::unordered_map<std::string, uint32_t> ids;
  std::string key;
  // Returns the node's id; *refs tells whether a rule is referenced in it.
  auto id_of = [&](auto&& self, const Expr& e, bool* refs) -> uint32_t {
    if (auto it = fixed.find(&e); it != fixed.end()) return it->second;
    if (auto it = memo.find(&e); it != memo.end()) {
      *refs = true;
      return it->second;
    }
    bool below = e.kind == ExprKind::kRule;
    std::vector<uint32_t> kids;
    kids.reserve(e.children.size());
    for (const auto& c : e.children) kids.push_back(self(self, *c, &below));
    key.clear();
    key.push_back(static_cast<char>(e.kind));
    auto put = [&](const void* p, size_t bytes) { key.append(static_cast<const char*>(p), bytes); };
    if (e.kind == ExprKind::kBytes) put(e.bytes.words().data(), sizeof(uint64_t) * 4);
    if (e.kind == ExprKind::kRepeat) {
      put(&e.min, sizeof e.min);
      put(&e.max, sizeof e.max);
    }
    if (e.kind == ExprKind::kRule) {
      const int target = e.rule >= 0 && e.rule < n ? rep[e.rule] : e.rule;
      put(&target, sizeof target);
    }
    if (!kids.empty()) put(kids.data(), kids.size() * sizeof(uint32_t));
    const uint32_t id = ids.emplace(key, static_cast<uint32_t>(ids.size())).first->second;
    (below ? memo : fixed).emplace(&e, id);
    *refs |= below;
    return id;
  };
  for (int round = 0; round < 4; ++round) {
    memo.clear();
    std::unordered_map<uint32_t, int> first;  // body id -> representative
    std::vector<int> next = rep;
    bool any_refs = false;
    for (int r : candidates) next[r] = first.emplace(id_of(id_of, *rules[r].body, &any_refs), r).first->second;
    if (next == rep) break;
    rep = std::move(next);
  }
  return rep;
}

}  // namespace

std::shared_ptr<const CompiledGrammar> CompiledGrammar::compile(const Grammar& grammar, const CompileLimits& limits) {
  const auto& rules = grammar.rules();
  const int num_rules = static_cast<int>(rules.size());
  DI_CHECK(grammar.root() >= 0 && grammar.root() < num_rules) << "grammar has no root rule";
  for (const Rule& r : rules) DI_CHECK(r.body != nullptr) << "grammar rule '" << r.name << "' is used but not defined";

  auto out = std::make_shared<CompiledGrammar>();
  out->root_ = grammar.root();
  std::vector<RuleDfa> dfas;
  std::vector<int32_t> base(num_rules);
  int total = 0;
  // A rule that another one stands for is never called: it gets the empty language (no states to trim or walk).
  const std::vector<int> rep = rule_representatives(grammar);
  for (int r = 0; r < num_rules; ++r) {
    dfas.push_back(determinize(rep[r] == r ? *rules[r].body : *nothing_expr(), num_rules, limits,
                               limits.max_dfa_states - total, &rep));
    base[r] = total;
    total += static_cast<int>(dfas.back().trans.size());
    out->rule_names_.push_back(rules[r].name);
    out->rule_start_.push_back(base[r]);
  }

  // Trim: a state is live iff a complete rule body is reachable from it; a rule is productive iff its start is
  // live. Worklist over reverse edges (a call edge makes its source live once the callee is productive and the
  // return target is live).
  std::vector<char> live(total, 0), productive(num_rules, 0);
  std::vector<std::vector<int32_t>> byte_preds(total);
  std::vector<std::vector<std::pair<int32_t, int32_t>>> call_sites(num_rules);  // (source, target)
  std::vector<std::vector<std::pair<int32_t, int32_t>>> call_preds(total);      // by target: (source, callee)
  std::vector<int32_t> owner(total);
  std::vector<int32_t> work;
  for (int r = 0; r < num_rules; ++r) {
    const RuleDfa& d = dfas[r];
    for (size_t s = 0; s < d.trans.size(); ++s) {
      int32_t g = base[r] + static_cast<int32_t>(s);
      owner[g] = r;
      for (int32_t t : d.trans[s])
        if (t >= 0) byte_preds[base[r] + t].push_back(g);
      for (auto [callee, t] : d.calls[s]) {
        call_sites[callee].emplace_back(g, base[r] + t);
        call_preds[base[r] + t].emplace_back(g, callee);
      }
      if (d.accepting[s]) {
        live[g] = 1;
        work.push_back(g);
      }
    }
  }
  while (!work.empty()) {
    int32_t g = work.back();
    work.pop_back();
    auto mark = [&](int32_t s) {
      if (!live[s]) {
        live[s] = 1;
        work.push_back(s);
      }
    };
    for (int32_t p : byte_preds[g]) mark(p);
    for (auto [src, callee] : call_preds[g])
      if (productive[callee]) mark(src);
    int r = owner[g];
    if (g == base[r] && !productive[r]) {
      productive[r] = 1;
      for (auto [src, target] : call_sites[r])
        if (live[target]) mark(src);
    }
  }
  DI_CHECK(productive[out->root_]) << "the grammar matches no string (root rule '" << rules[out->root_].name
                                   << "' cannot complete; an unsatisfiable schema?)";

  // Lay out the trimmed automaton.
  for (int r = 0; r < num_rules; ++r) {
    const RuleDfa& d = dfas[r];
    out->byte_class_.insert(out->byte_class_.end(), d.byte_class.begin(), d.byte_class.end());
    out->num_classes_.push_back(d.num_classes);
    for (size_t s = 0; s < d.trans.size(); ++s) {
      int32_t g = base[r] + static_cast<int32_t>(s);
      State st;
      st.rule = r;
      st.accepting = d.accepting[s];
      st.trans_offset = static_cast<uint32_t>(out->trans_.size());
      for (int32_t t : d.trans[s]) {
        int32_t gt = (t >= 0 && live[base[r] + t]) ? base[r] + t : -1;
        st.has_bytes |= gt >= 0;
        out->trans_.push_back(gt);
      }
      st.calls_begin = static_cast<uint32_t>(out->calls_.size());
      for (auto [callee, t] : d.calls[s])
        if (productive[callee] && live[base[r] + t]) out->calls_.push_back(Call{callee, base[r] + t});
      st.calls_end = static_cast<uint32_t>(out->calls_.size());
      (void)g;
      out->states_.push_back(st);
    }
  }

  // Left recursion: rule r "left-calls" c when c is called from a state reachable from r's start through calls
  // of nullable rules only. A cycle in that graph would make the matcher push forever without reading a byte.
  std::vector<char> nullable(num_rules, 0);
  auto reach_without_bytes = [&](int r, auto&& on_call) {
    std::vector<int32_t> stack{out->rule_start_[r]};
    std::unordered_map<int32_t, char> seen;
    seen[stack[0]] = 1;
    bool accepts = false;
    while (!stack.empty()) {
      int32_t s = stack.back();
      stack.pop_back();
      accepts |= out->states_[s].accepting;
      for (const Call* c = out->calls_begin(s); c != out->calls_end(s); ++c) {
        on_call(c->rule);
        if (nullable[c->rule] && !seen.count(c->target)) {
          seen[c->target] = 1;
          stack.push_back(c->target);
        }
      }
    }
    return accepts;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < num_rules; ++r)
      if (!nullable[r] && productive[r] && reach_without_bytes(r, [](int) {})) {
        nullable[r] = 1;
        changed = true;
      }
  }
  std::vector<std::vector<int>> left_calls(num_rules);
  for (int r = 0; r < num_rules; ++r) {
    if (!productive[r]) continue;
    reach_without_bytes(r, [&](int c) { left_calls[r].push_back(c); });
  }
  std::vector<char> color(num_rules, 0);
  std::vector<int> path;
  auto dfs = [&](auto&& self, int r) -> void {
    color[r] = 1;
    path.push_back(r);
    for (int c : left_calls[r]) {
      if (color[c] == 1) {
        std::string cycle;
        auto it = std::find(path.begin(), path.end(), c);
        for (; it != path.end(); ++it) cycle += rules[*it].name + " -> ";
        cycle += rules[c].name;
        DI_FAIL(ErrorCode::kInvalidArgument)
            << "left recursion is not supported (rewrite it with repetition): " << cycle;
      }
      if (color[c] == 0) self(self, c);
    }
    path.pop_back();
    color[r] = 2;
  };
  for (int r = 0; r < num_rules; ++r)
    if (color[r] == 0) dfs(dfs, r);
  return out;
}

std::string CompiledGrammar::detached_signature(int32_t state, size_t max_states,
                                                std::vector<uint32_t>* scratch) const {
  // Discovery order makes the numbering canonical: equal signatures <=> the same automaton up to renaming.
  // ids: [0, num_states) state ids, then [num_states, num_states + num_rules) rule ids; kNone = not seen yet.
  // After them, one flag word per state: 1 = known to reach more than max_states states. Whatever reaches such a
  // state reaches all it does, so the walk stops there at once (the flags assume one max_states per scratch).
  constexpr uint32_t kNone = 0xFFFFFFFFu;
  std::vector<uint32_t> local;
  std::vector<uint32_t>& ids = scratch != nullptr ? *scratch : local;
  const size_t n_states = states_.size();
  const size_t big_at = n_states + rule_names_.size();
  if (ids.size() != big_at + n_states) {
    ids.assign(big_at + n_states, kNone);
    std::fill(ids.begin() + static_cast<std::ptrdiff_t>(big_at), ids.end(), 0u);
  }
  if (ids[big_at + state]) return {};
  std::vector<int32_t> order{state};
  std::vector<int32_t> rules_seen;
  ids[state] = 0;
  std::string out;
  auto put = [&out](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  bool too_big = false;
  auto id_of = [&](int32_t s) -> uint32_t {
    if (s < 0) return kNone;
    too_big |= ids[big_at + s] != 0;
    uint32_t& id = ids[s];
    if (id == kNone) {
      id = static_cast<uint32_t>(order.size());
      order.push_back(s);
      too_big |= order.size() > max_states;
    }
    return id;
  };
  for (size_t i = 0; i < order.size() && !too_big; ++i) {
    const int32_t s = order[i];
    const State& st = states_[s];
    // A rule's byte classes once, at its first state; later states of the rule name the rule by its index.
    uint32_t& rid = ids[n_states + st.rule];
    const bool new_rule = rid == kNone;
    if (new_rule) {
      rid = static_cast<uint32_t>(rules_seen.size());
      rules_seen.push_back(st.rule);
    }
    put(rid);
    const int32_t classes = num_classes_[st.rule];
    if (new_rule) {
      put(static_cast<uint32_t>(classes));
      out.append(reinterpret_cast<const char*>(&byte_class_[static_cast<size_t>(st.rule) * 256]), 256);
    }
    put(static_cast<uint32_t>(st.accepting) | (static_cast<uint32_t>(st.has_bytes) << 1));
    for (int32_t c = 0; c < classes; ++c) put(id_of(trans_[st.trans_offset + c]));
    put(st.calls_end - st.calls_begin);
    for (const Call* c = calls_begin(s); c != calls_end(s); ++c) {
      put(id_of(rule_start_[c->rule]));
      put(id_of(c->target));
    }
  }
  for (int32_t s : order) ids[s] = kNone;
  for (int32_t r : rules_seen) ids[n_states + r] = kNone;
  if (too_big) {
    ids[big_at + state] = 1;
    out.clear();
  }
  return out;
}

std::string CompiledGrammar::describe_expected(int32_t state) const {
  std::string out;
  for (int b = 0; b < 256; ++b) {
    if (next(state, static_cast<uint8_t>(b)) < 0) continue;
    if (out.size() > 40) {
      out += "...";
      break;
    }
    if (b >= 0x20 && b < 0x7F) {
      out += static_cast<char>(b);
    } else {
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02X", b);
      out += buf;
    }
  }
  for (const Call* c = calls_begin(state); c != calls_end(state); ++c) out += " <" + rule_names_[c->rule] + ">";
  return out;
}

}  // namespace deepinfer::structured
