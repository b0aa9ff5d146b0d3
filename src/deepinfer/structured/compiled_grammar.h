// A Grammar lowered to one DFA per rule: the automaton the pushdown matcher runs.
//
// Every rule body is regular, so it becomes a DFA whose edges are bytes (through per-rule byte equivalence
// classes) and calls of other rules. A state may both consume bytes and call rules; the matcher explores both
// (it keeps a set of stacks). Compilation also
//   - trims states from which no complete string is reachable and calls of rules that match nothing, so that
//     "some stack is alive" really means "the bytes so far are a prefix of a sentence" (masks are exact);
//   - rejects left recursion (a rule reachable from itself without consuming a byte), which a stack-based
//     matcher cannot run, with the cycle in the message.
// States of all rules share one id space ("global state ids").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/structured/grammar.h"

namespace deepinfer::structured {

struct CompileLimits {
  int max_dfa_states = 2'000'000;  // over all rules
  int max_nfa_states_per_rule = 4'000'000;
};

class CompiledGrammar {
 public:
  struct Call {
    int32_t rule;    // callee
    int32_t target;  // global state to continue in after the callee returns
  };
  struct State {
    int32_t rule = 0;
    bool accepting = false;
    bool has_bytes = false;  // at least one byte leads to a live state
    uint32_t trans_offset = 0;
    uint32_t calls_begin = 0, calls_end = 0;
  };

  // Throws deepinfer::Error (InvalidArgument: undefined rule, left recursion, empty language;
  // ResourceExhausted: automaton over the limits).
  static std::shared_ptr<const CompiledGrammar> compile(const Grammar& grammar, const CompileLimits& limits = {});

  // -1 when byte b kills this path.
  int32_t next(int32_t state, uint8_t b) const {
    const State& st = states_[state];
    return trans_[st.trans_offset + byte_class_[static_cast<size_t>(st.rule) * 256 + b]];
  }
  // Bytes of one class behave alike in every state of `rule`: next(s, b) depends on b only through its class.
  uint8_t byte_class(int rule, uint8_t b) const { return byte_class_[static_cast<size_t>(rule) * 256 + b]; }
  const State& state(int32_t s) const { return states_[s]; }
  const Call* calls_begin(int32_t s) const { return calls_.data() + states_[s].calls_begin; }
  const Call* calls_end(int32_t s) const { return calls_.data() + states_[s].calls_end; }
  int32_t rule_start(int rule) const { return rule_start_[rule]; }
  int root_rule() const { return root_; }
  size_t num_states() const { return states_.size(); }
  size_t num_rules() const { return rule_names_.size(); }
  const std::string& rule_name(int rule) const { return rule_names_[rule]; }
  // Bytes that may follow from this state inside its own rule (for error messages).
  std::string describe_expected(int32_t state) const;
  // A canonical description of everything a frame in `state` can do without looking below itself: the states
  // reachable from it by bytes and calls (callee bodies included), renumbered in discovery order, with their
  // byte moves, calls and accepting flags. Two states with equal signatures (in this grammar or another one)
  // accept exactly the same byte strings from a detached frame, so their token-mask entries are equal. Empty
  // when more than `max_states` states are reachable (the caller then does not share).
  // `scratch` (optional, reused across calls with the same max_states) replaces the hash maps of the renumbering
  // by arrays indexed by state and rule, and remembers the states found to reach more than max_states: a later
  // walk that meets one stops there (most of the cost was walks running into the limit).
  std::string detached_signature(int32_t state, size_t max_states, std::vector<uint32_t>* scratch = nullptr) const;

 private:
  std::vector<State> states_;
  std::vector<Call> calls_;
  std::vector<int32_t> trans_;
  std::vector<uint8_t> byte_class_;   // 256 per rule
  std::vector<int32_t> num_classes_;  // per rule
  std::vector<int32_t> rule_start_;
  std::vector<std::string> rule_names_;
  int root_ = 0;
};

}  // namespace deepinfer::structured
