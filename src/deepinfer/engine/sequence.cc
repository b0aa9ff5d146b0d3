#include "deepinfer/engine/sequence.h"

namespace deepinfer {

std::string_view sequence_status_name(SequenceStatus s) {
  switch (s) {
    case SequenceStatus::kWaiting: return "waiting";
    case SequenceStatus::kRunning: return "running";
    case SequenceStatus::kDecoding: return "decoding";
    case SequenceStatus::kPreempted: return "preempted";
    case SequenceStatus::kFinished: return "finished";
  }
  return "?";
}

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kNone: return "none";
    case StopReason::kEos: return "eos";
    case StopReason::kStopToken: return "stop_token";
    case StopReason::kStopString: return "stop_string";
    case StopReason::kMaxTokens: return "max_tokens";
    case StopReason::kMaxModelLen: return "max_model_len";
    case StopReason::kAborted: return "aborted";
    case StopReason::kError: return "error";
    case StopReason::kGrammarComplete: return "grammar_complete";
    case StopReason::kGrammarDeadEnd: return "grammar_dead_end";
  }
  return "?";
}

}  // namespace deepinfer
