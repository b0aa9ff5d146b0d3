// How far a parser config provably accepts content-slice text (vocabulary.h: runs of complete UTF-8 characters
// without '"', '\\', 0x7F and controls), so that a trie walk can take the slice tokens of the vocabulary from
// precomputed masks instead of visiting them.
//
// For a config c, with "k-run" meaning any run of k slice characters:
//   all_alive S: every k-run with k <= S (and every byte prefix of one) keeps some stack alive and never reaches
//                the bottom of a detached frame, so every slice token of at most S characters is allowed and none
//                of them ends the state's rule;
//   all_dead  D: every D-run kills every stack, so no slice token of D or more characters is allowed.
// Inside an unbounded JSON string S is "unlimited" (max_chars); at position i of a `maxLength: n` string S = n - i
// and D = S + 1; a pattern or format usually gives S = 0 (some character is not allowed) and D unlimited, and the
// walk then visits those tokens as before. Bounds are computed level by level over the set of configs reachable
// after k characters, with one memoized "read one slice character" step per item, and are memoized per config.
// Items are DFA states of the frame's rule while every state reached is "clean" (no calls, not accepting: the
// config after it is that one frame) - JSON string and key rules, whose bounded forms have a state per position
// and, for "any key but the declared names", one per name prefix: thousands of states, cheap at this level.
// Otherwise items are configs of the StackGraph (each new one costs a closure), within a budget per call.
// Before the levels, a detached frame gets one closure check: when no clean DFA state reachable from it by slice
// characters refuses a character or leaves the clean states (string content, "any key but the declared names"
// with its state per name prefix), S is the maximum at once, and every state of that set is known closed too -
// the level-by-level sets of a large key automaton cost milliseconds, the check visits each state once.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "deepinfer/structured/stack_graph.h"

namespace deepinfer::structured {

struct SliceBounds {
  static constexpr uint32_t kUnlimited = 0xFFFF;
  uint32_t all_alive = 0;          // S
  uint32_t all_dead = kUnlimited;  // D
};

class ContentSliceAnalyzer {
 public:
  // `max_chars`: lengths beyond this are not examined (TokenTrie::max_slice_chars, or less to bound the work);
  // S is capped at it, D is kUnlimited when no level up to it is empty.
  ContentSliceAnalyzer(StackGraph* graph, uint32_t max_chars) : graph_(graph), max_chars_(max_chars) {}
  SliceBounds bounds(uint32_t config);

  // Levels larger than this end the analysis early (S is then what was verified so far).
  static constexpr size_t kMaxLevelSize = 4096;
  // Once S is known, levels larger than this end the search for D (D stays unlimited).
  static constexpr size_t kMaxDeadSearchLevel = 8;
  // New config-level steps one bounds() call may make; past it S is what was verified so far.
  static constexpr size_t kMaxConfigSteps = 64;

 private:
  struct CharStep {
    std::vector<uint32_t> next;  // items after one slice character (sorted, unique, none dead)
    bool dies = false;           // some character (or a byte of one) kills every stack
    bool unknown = false;        // some byte prefix reaches the bottom of a detached frame (configs), or a state
                                 // that is not clean (DFA states)
    // DFA states only: the unclean states reached at a character boundary that just call rules (no bytes of their
    // own, not accepting) - "any key but the names" once it leaves the names calls the shared rest-of-string rule.
    // `unknown` is set for them too; closed_from looks into their callees. other_unknown: unknown for another reason.
    std::vector<int32_t> callers;
    bool other_unknown = false;
  };
  // One byte per (byte class of `rule`, next UTF-8 state) among the bytes that continue a slice character.
  const std::vector<std::pair<uint8_t, int8_t>>& representatives(int rule, int utf8_state);
  const CharStep& state_char_step(int32_t state);
  const CharStep& config_char_step(uint32_t config);
  // True when every slice run from `state` stays in clean live DFA states (S unlimited, D none).
  // A state that only calls rules counts when every callee's start state is clean and closed (`depth` bounds
  // that nesting).
  bool closed_from(int32_t state, int depth = 0);
  template <typename StepFn>
  SliceBounds levels(uint32_t start, StepFn&& step, bool* gave_up);

  StackGraph* graph_;
  uint32_t max_chars_;
  std::vector<std::vector<std::pair<uint8_t, int8_t>>> reps_;  // per (rule, UTF-8 state)
  std::vector<std::unique_ptr<CharStep>> state_steps_;         // per DFA state
  std::vector<int8_t> state_closed_;  // per DFA state: closed_from is 1 true / -1 false / 0 not known (2 in a walk)
  std::unordered_map<uint32_t, CharStep> config_steps_;
  size_t config_steps_made_ = 0;
  std::unordered_map<uint32_t, SliceBounds> bounds_;
  std::vector<std::pair<int32_t, int>> step_frontier_, step_seen_;  // state_char_step's scratch
  std::vector<uint32_t> step_next_;
  std::vector<int32_t> step_callers_;
};

}  // namespace deepinfer::structured
