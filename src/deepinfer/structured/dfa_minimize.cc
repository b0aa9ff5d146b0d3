#include "deepinfer/structured/dfa_minimize.h"

#include <algorithm>
#include <numeric>

#include "deepinfer/core/error.h"

namespace deepinfer::structured {
namespace {

// A partition of {0..n-1} that can be refined: each set is a contiguous range of `elems`; marking moves an
// element to the front of its set's range, split() cuts every touched set into its marked and unmarked parts.
// The smaller part becomes the new set (index z), which is what bounds the work by O(m log n): an element moves
// to a new set at most log n times.
struct Refinable {
  int32_t z = 0;  // number of sets
  std::vector<int32_t> elems, loc, set_of, first, past, marked, touched;

  void init(int32_t n) {
    elems.resize(n);
    std::iota(elems.begin(), elems.end(), 0);
    loc = elems;
    set_of.assign(n, 0);
    first.assign(1, 0);
    past.assign(1, n);
    marked.assign(1, 0);
    z = n > 0 ? 1 : 0;
  }
  void mark(int32_t e) {
    const int32_t s = set_of[e];
    const int32_t i = loc[e], j = first[s] + marked[s];
    if (i < j) return;  // marked already
    elems[i] = elems[j];
    loc[elems[i]] = i;
    elems[j] = e;
    loc[e] = j;
    if (marked[s]++ == 0) touched.push_back(s);
  }
  void split() {
    while (!touched.empty()) {
      const int32_t s = touched.back();
      touched.pop_back();
      const int32_t j = first[s] + marked[s];
      if (j == past[s]) {  // every element marked: nothing to cut
        marked[s] = 0;
        continue;
      }
      if (marked[s] <= past[s] - j) {  // the marked part is the smaller one: it leaves
        first.push_back(first[s]);
        past.push_back(j);
        first[s] = j;
      } else {  // the unmarked part leaves
        first.push_back(j);
        past.push_back(past[s]);
        past[s] = j;
      }
      marked.push_back(0);
      for (int32_t i = first[z]; i < past[z]; ++i) set_of[elems[i]] = z;
      marked[s] = 0;
      ++z;
    }
  }
};

}  // namespace

std::vector<int32_t> minimize_dfa(int32_t num_states, const std::vector<uint8_t>& accepting,
                                  const std::vector<DfaEdge>& edges) {
  DI_CHECK(static_cast<int32_t>(accepting.size()) == num_states) << "minimize_dfa: one accepting flag per state";
  std::vector<int32_t> block(num_states, 0);
  if (num_states <= 1) return block;
  const int32_t m = static_cast<int32_t>(edges.size());

  Refinable states;
  states.init(num_states);
  for (int32_t s = 0; s < num_states; ++s)
    if (accepting[s]) states.mark(s);
  states.split();

  // Transitions, first partitioned by label ("cords"); a cord later holds the transitions of one label whose
  // targets lie in one block.
  Refinable cords;
  cords.init(m);
  if (m > 0) {
    // Counting sort by label (labels are small: byte classes, then called rules).
    int32_t lo = edges[0].label, hi = edges[0].label;
    for (const DfaEdge& e : edges) {
      lo = std::min(lo, e.label);
      hi = std::max(hi, e.label);
    }
    std::vector<int32_t> count(static_cast<size_t>(hi - lo) + 2, 0);
    for (const DfaEdge& e : edges) ++count[e.label - lo + 1];
    std::partial_sum(count.begin(), count.end(), count.begin());
    for (int32_t t = 0; t < m; ++t) cords.elems[count[edges[t].label - lo]++] = t;
    cords.first.clear();
    cords.past.clear();
    cords.marked.clear();
    cords.z = 0;
    for (int32_t i = 0; i < m; ++i) {
      const int32_t t = cords.elems[i];
      if (i == 0 || edges[t].label != edges[cords.elems[i - 1]].label) {
        if (i > 0) cords.past.push_back(i);
        cords.first.push_back(i);
        cords.marked.push_back(0);
        ++cords.z;
      }
      cords.set_of[t] = cords.z - 1;
      cords.loc[t] = i;
    }
    cords.past.push_back(m);
  }

  // Incoming transitions of each state.
  std::vector<int32_t> in_begin(num_states + 1, 0), in_edges(m);
  for (const DfaEdge& e : edges) {
    DI_CHECK(e.from >= 0 && e.from < num_states && e.to >= 0 && e.to < num_states) << "minimize_dfa: bad edge";
    ++in_begin[e.to + 1];
  }
  std::partial_sum(in_begin.begin(), in_begin.end(), in_begin.begin());
  {
    std::vector<int32_t> fill(in_begin.begin(), in_begin.end() - 1);
    for (int32_t t = 0; t < m; ++t) in_edges[fill[edges[t].to]++] = t;
  }

  // Split blocks by the sources of each cord, and cords by the blocks of their targets, until both are stable.
  // Block 0 is never a splitter at first: the cords start as "every transition of a label", i.e. targets in any
  // block, and block 1 + that cover block 0 (Hopcroft's "all but one" argument).
  int32_t b = 1, c = 0;
  while (c < cords.z) {
    for (int32_t i = cords.first[c]; i < cords.past[c]; ++i) states.mark(edges[cords.elems[i]].from);
    states.split();
    ++c;
    while (b < states.z) {
      for (int32_t i = states.first[b]; i < states.past[b]; ++i) {
        const int32_t s = states.elems[i];
        for (int32_t j = in_begin[s]; j < in_begin[s + 1]; ++j) cords.mark(in_edges[j]);
      }
      cords.split();
      ++b;
    }
  }

  // Number blocks by their smallest state.
  std::vector<int32_t> renumber(states.z, -1);
  int32_t next = 0;
  for (int32_t s = 0; s < num_states; ++s) {
    int32_t& r = renumber[states.set_of[s]];
    if (r < 0) r = next++;
    block[s] = r;
  }
  return block;
}

}  // namespace deepinfer::structured
