// Minimization of a deterministic automaton with a partial transition function (Valmari & Lehtinen's partition
// refinement of states and transitions, O(m log n)).
//
// Why: subset construction gives every path through a rule body its own states even when their futures are equal.
// The "any key but the declared names" rule of a JSON object has, for each name prefix, its own intermediate
// UTF-8 and `\uXXXX` states on the path that leaves the names, all of which continue identically (4,033 states for
// 168 prefixes in maskbench's Kubernetes---kb_858). Every analysis that walks a rule's states (the mask cache's
// closure check, the detached signatures, the trie walks' StackGraph configs) pays for each copy.
//
// The automaton is given as labelled edges; a label is any integer (the compiler uses byte classes and, above
// them, called rules: a call is one more letter, so states are merged only when their calls agree too). At most
// one edge per (state, label). The result is a congruence: states in one block agree on `accepting`, have edges
// on the same labels, and their targets on each label lie in one block - so merging a block's states keeps the
// accepted language of every state. Missing edges are not completed by a sink: a state from which nothing is
// accepted is not merged with "no edge" (the compiler trims those states afterwards anyway).
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer::structured {

struct DfaEdge {
  int32_t from;
  int32_t label;
  int32_t to;
};

// Block of each state of the coarsest congruence. Blocks are numbered by their smallest state, so state 0 is in
// block 0 and a partition that merges nothing returns the identity. The number of blocks is max + 1.
std::vector<int32_t> minimize_dfa(int32_t num_states, const std::vector<uint8_t>& accepting,
                                  const std::vector<DfaEdge>& edges);

}  // namespace deepinfer::structured
