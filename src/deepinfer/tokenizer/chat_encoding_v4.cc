// The DeepSeek-V4 and V4.1 prompt encodings (deepseek-recipe's DeepseekV4Encoding / DeepseekV41Encoding),
// rules as observed on tests/data/tokenizer/chat_expected.json:
//   - V4 puts the reasoning-effort preamble, every system message ("\n\n"-joined) and the tool section after
//     BOS. V4.1 opens a `<｜System｜>` block with the "Reasoning Effort: N" line (thinking only), the first
//     message if it is a system message, and the tool section; later system messages are `<｜System｜>` blocks
//     in place.
//   - Consecutive user and tool messages form one `<｜User｜>` turn, parts joined by "\n\n"; tool results are
//     `<tool_result>…</tool_result>`, ordered like the calls of the assistant message before them.
//   - Past reasoning is kept only when tools are declared (V4.1: and thinking is on); otherwise every
//     assistant message but a prefix opens with `</think>`.
//   - Tool calls are a DSML block after the content and "\n\n"; JSON-object arguments become one parameter per
//     key (strings as is with string="true", other values as spaced JSON), anything else one "arguments"
//     string parameter. `<` before the DSML token is plain text: the special token is `｜DSML｜`.
#include <algorithm>
#include <map>

#include "deepinfer/core/error.h"
#include "deepinfer/tokenizer/chat_encoding.h"

namespace deepinfer::tokenizer::chat_detail {

namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kSystem = "<｜System｜>";
constexpr std::string_view kReminder = "<｜latest_reminder｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kDsml = "｜DSML｜";

constexpr std::string_view kV4EffortMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose "
    "the problem into its most fundamental components, trace every causal chain to its root, and resolve the "
    "underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are certain "
    "that no assumption remains unchecked and no error remains undiscovered.\n\n";
constexpr std::string_view kV4EffortHigh =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

struct Dsml {
  std::string_view calls, invoke, parameter;
};
constexpr Dsml kV4Dsml{"tool_calls", "invoke", "parameter"};
constexpr Dsml kV41Dsml{" calls", " invoke", " parameter"};

// `<｜DSML｜name>`-style tags: "<" or "</" as text, the DSML token, then the rest as text.
void tag(PromptBuilder& b, std::string_view open, std::string_view rest) {
  b.text(open);
  b.special(kDsml);
  b.text(rest);
}

void tool_section(PromptBuilder& b, const ChatRequest& req, const Dsml& d) {
  std::string calls(d.calls), inv(d.invoke), par(d.parameter);
  b.text("\n\n## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke "
         "tools by writing a \"");
  tag(b, "<", calls + ">\" block like the following:\n\n");
  tag(b, "<", calls + ">\n");
  tag(b, "<", inv + " name=\"$TOOL_NAME\">\n");
  tag(b, "<", par + " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE");
  tag(b, "</", par + ">\n...\n");
  tag(b, "</", inv + ">\n");
  tag(b, "<", inv + " name=\"$TOOL_NAME2\">\n...\n");
  tag(b, "</", inv + ">\n");
  tag(b, "</", calls + ">\n\n");
  b.text("String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by ");
  // The think tags in the instructions are special tokens too.
  b.special(kThinkStart);
  b.text("), you MUST output your complete reasoning inside ");
  b.special(kThinkStart);
  b.text("...");
  b.special(kThinkEnd);
  b.text(" BEFORE any tool calls or final response.\n\nOtherwise, output directly after ");
  b.special(kThinkEnd);
  b.text(" with tool calls or final response.\n\n### Available Tool Schemas\n\n");
  for (const auto* t = req.tools.data(); t != req.tools.data() + req.tools.size(); ++t) {
    nlohmann::ordered_json schema;
    schema["name"] = t->name;
    schema["description"] = t->description.value_or("");
    schema["parameters"] = t->parameters;
    b.text(dump_spaced(schema) + "\n");
  }
  b.text("\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n");
}

void tool_calls_block(PromptBuilder& b, const ChatMessage& m, const Dsml& d, bool v41) {
  std::string calls(d.calls), inv(d.invoke), par(d.parameter);
  b.text("\n\n");
  tag(b, "<", calls + ">\n");
  for (const auto& c : m.tool_calls) {
    tag(b, "<", inv + " name=\"" + c.name + "\">\n");
    std::vector<std::pair<std::string, std::pair<std::string, bool>>> params;  // name → (value, is string)
    auto args = nlohmann::ordered_json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
    if (!args.is_discarded() && args.is_object()) {
      for (auto it = args.begin(); it != args.end(); ++it) {
        if (it.value().is_string())
          params.push_back({it.key(), {it.value().get<std::string>(), true}});
        else
          params.push_back({it.key(), {dump_spaced(it.value()), false}});
      }
    } else {
      params.push_back({"arguments", {c.arguments, true}});
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (v41 && i > 0) b.text("\n");
      const auto& [name, value] = params[i];
      tag(b, "<", par + " name=\"" + name + "\" string=\"" + (value.second ? "true" : "false") + "\">" +
                      value.first);
      tag(b, "</", par + ">");
      if (!v41) b.text("\n");
    }
    if (v41) b.text("\n");
    tag(b, "</", inv + ">\n");
  }
  tag(b, "</", calls + ">");
}

int v41_effort(const std::string& effort) {
  if (effort == "low") return 50;
  if (effort == "max") return 100;
  return 75;  // default, "high", "xhigh"
}

}  // namespace

RenderedPrompt render_v4(const ChatRequest& req, bool v41) {
  const Dsml& d = v41 ? kV41Dsml : kV4Dsml;
  const auto& msgs = req.messages;
  PromptBuilder b;
  b.special(kBos);
  const bool tools = !req.tools.empty() && req.tool_choice != "none";
  size_t first = 0;  // messages before this index are already rendered
  if (!v41) {
    if (req.thinking && req.reasoning_effort != "low") b.text(req.reasoning_effort == "max" ? kV4EffortMax : kV4EffortHigh);
    bool first_sp = true;
    for (const auto& m : msgs) {
      if (m.role != ChatRole::kSystem || m.content.empty()) continue;
      if (!first_sp) b.text("\n\n");
      b.text(m.content);
      first_sp = false;
    }
    if (tools) tool_section(b, req, d);
  } else {
    const bool lead_system = !msgs.empty() && msgs[0].role == ChatRole::kSystem;
    if (lead_system || tools || (req.thinking && !msgs.empty())) {
      b.special(kSystem);
      if (req.thinking) {
        b.text("Reasoning Effort: " + std::to_string(v41_effort(req.reasoning_effort)) +
               " (range 1-100, the higher the value, the more thorough the reasoning)\n\n");
      }
      if (lead_system) {
        b.text(msgs[0].content);
        first = 1;
      }
      if (tools) tool_section(b, req, d);
    }
  }
  const bool keep_reasoning = tools && (!v41 || req.thinking);
  // Tool results are ordered like the calls of the last assistant message.
  std::map<std::string, size_t> call_order;
  bool in_user_turn = false;
  for (size_t i = first; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    switch (m.role) {
      case ChatRole::kSystem:  // V4 hoisted it to the top; the user turn goes on
        if (v41) {
          in_user_turn = false;
          b.special(kSystem);
          b.text(m.content);
        }
        break;
      case ChatRole::kLatestReminder:
        b.special(kReminder);
        b.text(m.content);
        in_user_turn = false;
        break;
      case ChatRole::kUser:
      case ChatRole::kTool: {
        // Gather the run of user/tool messages: tool results sorted by call order, in front of their run.
        size_t j = i;
        while (j < msgs.size() && (msgs[j].role == ChatRole::kUser || msgs[j].role == ChatRole::kTool)) ++j;
        std::vector<const ChatMessage*> run;
        for (size_t k = i; k < j; ++k) run.push_back(&msgs[k]);
        auto order = [&](const ChatMessage* x) -> size_t {
          if (x->role != ChatRole::kTool || !x->tool_call_id) return call_order.size();
          auto it = call_order.find(*x->tool_call_id);
          return it == call_order.end() ? call_order.size() : it->second;
        };
        // Only consecutive tool messages are reordered among themselves.
        for (size_t s = 0; s < run.size();) {
          size_t e = s;
          while (e < run.size() && run[e]->role == ChatRole::kTool) ++e;
          std::stable_sort(run.begin() + s, run.begin() + e, [&](auto* x, auto* y) { return order(x) < order(y); });
          s = e == s ? s + 1 : e;
        }
        if (!in_user_turn) b.special(kUser);
        bool any = in_user_turn;
        for (size_t k = 0; k < run.size(); ++k) {
          // V4 skips an empty user text unless it follows a tool result.
          if (!v41 && run[k]->content.empty() && run[k]->role == ChatRole::kUser &&
              (k == 0 || run[k - 1]->role != ChatRole::kTool))
            continue;
          if (any) b.text("\n\n");
          any = true;
          if (run[k]->role == ChatRole::kTool)
            b.text("<tool_result>" + run[k]->content + "</tool_result>");
          else
            b.text(run[k]->content);
        }
        in_user_turn = true;
        i = j - 1;
        break;
      }
      case ChatRole::kAssistant: {
        in_user_turn = false;
        b.special(kAssistant);
        // A prefix message keeps its reasoning (V4: whenever it has some; V4.1: in thinking mode).
        const bool keep = keep_reasoning || (m.prefix && (v41 ? req.thinking : m.reasoning_content.has_value()));
        if (keep && (m.reasoning_content || v41)) {
          b.special(kThinkStart);
          b.text(m.reasoning_content.value_or(""));
          b.special(kThinkEnd);
        } else {
          b.special(kThinkEnd);
        }
        if (!m.content_null) b.text(m.content);
        if (!m.tool_calls.empty()) tool_calls_block(b, m, d, v41);
        call_order.clear();
        for (size_t c = 0; c < m.tool_calls.size(); ++c) call_order.emplace(m.tool_calls[c].id, c);
        if (m.prefix) return b.take();
        b.special(kEos);
        break;
      }
    }
  }
  if (req.add_generation_prompt) {
    b.special(kAssistant);
    b.special(req.thinking ? kThinkStart : kThinkEnd);
    if (tools && req.tool_choice == "required") {
      b.text("\n\n");
      tag(b, "<", std::string(d.calls) + ">\n");
    }
  }
  return b.take();
}

}  // namespace deepinfer::tokenizer::chat_detail
