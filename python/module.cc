// deepinfer._core: pybind11 binding of api::Llm (src/deepinfer/api/llm.h) and SamplingParams. Only conversion
// lives here; the Python layer (python/deepinfer/*.py) adds argument normalisation and the progress bar.
//
// The GIL is released while the C++ side works (model loading, engine steps, tokenization of a batch); the
// progress callback takes it back once per engine step, which is also where Ctrl-C is noticed.
// deepinfer::Error becomes a Python exception by code, carrying the C++ message (without the source location):
// InvalidArgument → ValueError, NotFound → FileNotFoundError, ResourceExhausted → MemoryError,
// Unsupported → NotImplementedError, Internal → RuntimeError.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "deepinfer/api/llm.h"
#include "deepinfer/core/error.h"
#include "deepinfer/core/logging.h"
#include "deepinfer/io/checkpoint.h"
#ifdef DEEPINFER_WITH_CUDA
#include "deepinfer/ops/cuda/cuda_runtime.h"
#endif

namespace py = pybind11;
using namespace deepinfer;

namespace {

PyObject* exception_type(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return PyExc_ValueError;
    case ErrorCode::kNotFound:
      return PyExc_FileNotFoundError;
    case ErrorCode::kResourceExhausted:
      return PyExc_MemoryError;
    case ErrorCode::kUnsupported:
      return PyExc_NotImplementedError;
    case ErrorCode::kInternal:
      return PyExc_RuntimeError;
  }
  return PyExc_RuntimeError;
}

// A Python prompt: str → text, any sequence of ints → token ids.
api::PromptInput to_prompt(const py::handle& h, size_t i) {
  if (py::isinstance<py::str>(h)) return api::PromptInput::from_text(h.cast<std::string>());
  try {
    return api::PromptInput::from_ids(h.cast<std::vector<TokenId>>());
  } catch (const py::cast_error&) {
    throw py::type_error("prompts[" + std::to_string(i) + "]: expected a str or a list of int token ids, got " +
                         std::string(py::str(py::type::of(h).attr("__name__"))));
  }
}

std::vector<api::PromptInput> to_prompts(const py::sequence& seq) {
  std::vector<api::PromptInput> out;
  out.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) out.push_back(to_prompt(seq[i], i));
  return out;
}

// One dict per token: the chosen token first, then the top-k (vLLM's shape, with plain float values).
py::object logprobs_to_py(bool has, const std::vector<SampleResult>& lps) {
  if (!has) return py::none();
  py::list out;
  for (const SampleResult& r : lps) {
    py::dict d;
    d[py::int_(r.token)] = r.logprob;
    for (const TokenLogprob& t : r.top_logprobs) {
      py::int_ key(t.token);
      if (!d.contains(key)) d[key] = t.logprob;
    }
    out.append(std::move(d));
  }
  return out;
}

std::string ids_repr(const std::vector<TokenId>& ids) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ids.size(); ++i) os << (i ? ", " : "") << ids[i];
  os << "]";
  return os.str();
}

// The stream object Python holds. Destroying it aborts unfinished requests under the Llm's mutex, which another
// thread's generate may hold while it waits for the GIL: so the GIL is released around that destruction.
struct PyStream {
  std::unique_ptr<api::GenerationStream> stream;
  ~PyStream() {
    if (stream && Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release release;
      stream.reset();
    }
  }
};

// A JSON Schema given as text or as a Python object (dict), as vLLM accepts it.
std::string schema_text(const py::object& o) {
  if (py::isinstance<py::str>(o)) return o.cast<std::string>();
  return py::module_::import("json").attr("dumps")(o).cast<std::string>();
}

// Python properties over SamplingParams::structured: the spec while that kind is set, else None; setting None
// clears the constraint if it is of that kind.
void def_constraint(py::class_<SamplingParams>& c, const char* name, StructuredOutputKind kind) {
  c.def_property(
      name,
      [kind](const SamplingParams& p) -> py::object {
        if (p.structured.kind != kind) return py::none();
        return py::str(p.structured.spec);
      },
      [kind](SamplingParams& p, const py::object& v) {
        if (v.is_none()) {
          if (p.structured.kind == kind) p.structured = {};
          return;
        }
        const bool lenient = p.structured.lenient;
        p.structured = {kind, kind == StructuredOutputKind::kJsonSchema ? schema_text(v) : v.cast<std::string>()};
        p.structured.lenient = lenient;
      });
}

SamplingParams make_sampling_params(float temperature, float top_p, int top_k, float min_p, float repetition_penalty,
                                    float presence_penalty, float frequency_penalty, std::optional<uint64_t> seed,
                                    std::optional<int> max_tokens, int min_tokens, int n, const py::object& stop,
                                    std::vector<TokenId> stop_token_ids, bool ignore_eos, std::optional<int> logprobs,
                                    const py::object& json_schema, bool json_object, std::optional<std::string> regex,
                                    std::optional<std::string> grammar, bool structured_lenient) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.min_p = min_p;
  p.repetition_penalty = repetition_penalty;
  p.presence_penalty = presence_penalty;
  p.frequency_penalty = frequency_penalty;
  p.seed = seed;
  p.max_tokens = max_tokens;
  p.min_tokens = min_tokens;
  p.n = n;
  if (py::isinstance<py::str>(stop)) {
    p.stop = {stop.cast<std::string>()};
  } else if (!stop.is_none()) {
    p.stop = stop.cast<std::vector<std::string>>();
  }
  p.stop_token_ids = std::move(stop_token_ids);
  p.ignore_eos = ignore_eos;
  p.logprobs = logprobs;
  const int n_constraints = !json_schema.is_none() + json_object + regex.has_value() + grammar.has_value();
  if (n_constraints > 1)
    throw py::value_error("structured output: set at most one of json_schema, json_object, regex, grammar");
  if (!json_schema.is_none()) p.structured = StructuredOutputParams::json_schema(schema_text(json_schema));
  if (json_object) p.structured = StructuredOutputParams::json_object();
  if (regex) p.structured = StructuredOutputParams::regex(*regex);
  if (grammar) p.structured = StructuredOutputParams::grammar(*grammar);
  p.structured.lenient = structured_lenient;
  validate(p);
  return p;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "DeepInfer C++ engine binding (use the `deepinfer` package, not this module)";
  init_logging();  // to stderr, so stdout stays the program's output

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(exception_type(e.code()), e.message().c_str());
    }
  });

  m.def(
      "resolve_model_dir",
      [](std::optional<std::string> model, std::optional<std::string> env, std::string embedded) {
        ResolvedModel r = resolve_model_dir(model, env, embedded);
        return py::make_tuple(r.dir, r.source);
      },
      py::arg("model"), py::arg("env"), py::arg("embedded"),
      "model wins over env (DEEPINFER_HF_MODEL_DIR), which wins over the embedded default; returns (dir, source)");
  m.def("embedded_model_dir", [] {
    namespace fs = std::filesystem;
    const fs::path committed = fs::path(DEEPINFER_SOURCE_DIR) / "models" / "default";
    if (fs::exists(committed / "config.json")) return committed.string();
    return std::string(DEEPINFER_BUILD_MODEL_DIR);
  });
  m.def("cuda_device_count", [] {
#ifdef DEEPINFER_WITH_CUDA
    return cuda::device_count();
#else
    return 0;
#endif
  });
  m.def("built_with_cuda", [] {
#ifdef DEEPINFER_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def(
      "set_log_level", [](const std::string& level) { set_log_level(level); }, py::arg("level"),
      "trace | debug | info | warn | error | off (logs go to stderr)");

  py::class_<SamplingParams> sampling(m, "SamplingParams", "How a request turns logits into tokens and when it stops");
  sampling
      .def(py::init(&make_sampling_params), py::arg("temperature") = 1.0f, py::arg("top_p") = 1.0f,
           py::arg("top_k") = 0, py::arg("min_p") = 0.0f, py::arg("repetition_penalty") = 1.0f,
           py::arg("presence_penalty") = 0.0f, py::arg("frequency_penalty") = 0.0f, py::arg("seed") = py::none(),
           py::arg("max_tokens") = 16, py::arg("min_tokens") = 0, py::arg("n") = 1, py::arg("stop") = py::none(),
           py::arg("stop_token_ids") = std::vector<TokenId>{}, py::arg("ignore_eos") = false,
           py::arg("logprobs") = py::none(), py::arg("json_schema") = py::none(), py::arg("json_object") = false,
           py::arg("regex") = py::none(), py::arg("grammar") = py::none(), py::arg("structured_lenient") = false,
           "Raises ValueError naming the parameter when a value is out of range. max_tokens=None generates up to "
           "max_model_len. Structured output: at most one of json_schema (str or dict), json_object, regex, grammar "
           "(GBNF with a root rule); structured_lenient turns unsupported JSON Schema keywords into warnings.")
      .def_readwrite("temperature", &SamplingParams::temperature)
      .def_readwrite("top_p", &SamplingParams::top_p)
      .def_readwrite("top_k", &SamplingParams::top_k)
      .def_readwrite("min_p", &SamplingParams::min_p)
      .def_readwrite("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_readwrite("presence_penalty", &SamplingParams::presence_penalty)
      .def_readwrite("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_readwrite("seed", &SamplingParams::seed)
      .def_readwrite("max_tokens", &SamplingParams::max_tokens)
      .def_readwrite("min_tokens", &SamplingParams::min_tokens)
      .def_readwrite("n", &SamplingParams::n)
      .def_readwrite("stop", &SamplingParams::stop)
      .def_readwrite("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_readwrite("ignore_eos", &SamplingParams::ignore_eos)
      .def_readwrite("logprobs", &SamplingParams::logprobs)
      .def("__repr__", [](const SamplingParams& p) {
        std::ostringstream os;
        os << "SamplingParams(temperature=" << p.temperature << ", top_p=" << p.top_p << ", top_k=" << p.top_k
           << ", min_p=" << p.min_p << ", seed=" << (p.seed ? std::to_string(*p.seed) : "None")
           << ", max_tokens=" << (p.max_tokens ? std::to_string(*p.max_tokens) : "None") << ", n=" << p.n
           << ", ignore_eos=" << (p.ignore_eos ? "True" : "False")
           << ", logprobs=" << (p.logprobs ? std::to_string(*p.logprobs) : "None") << ")";
        return os.str();
      });
  sampling.def("clone", [](const SamplingParams& p) { return p; })
      .def("__copy__", [](const SamplingParams& p) { return p; })
      .def(
          "__deepcopy__", [](const SamplingParams& p, const py::dict&) { return p; }, py::arg("memo"));
  def_constraint(sampling, "json_schema", StructuredOutputKind::kJsonSchema);
  def_constraint(sampling, "regex", StructuredOutputKind::kRegex);
  def_constraint(sampling, "grammar", StructuredOutputKind::kGrammar);
  sampling.def_property(
      "json_object", [](const SamplingParams& p) { return p.structured.kind == StructuredOutputKind::kJsonObject; },
      [](SamplingParams& p, bool on) {
        if (on)
          p.structured = StructuredOutputParams::json_object();
        else if (p.structured.kind == StructuredOutputKind::kJsonObject)
          p.structured = {};
      });
  sampling.def_property(
      "structured_lenient", [](const SamplingParams& p) { return p.structured.lenient; },
      [](SamplingParams& p, bool v) { p.structured.lenient = v; });

  py::class_<api::CompletionOutput>(m, "CompletionOutput", "One sample of a request")
      .def_readonly("index", &api::CompletionOutput::index)
      .def_readonly("text", &api::CompletionOutput::text)
      .def_readonly("token_ids", &api::CompletionOutput::token_ids)
      .def_property_readonly("finish_reason",
                             [](const api::CompletionOutput& o) -> py::object {
                               if (o.finish_reason.empty()) return py::none();
                               return py::str(o.finish_reason);
                             })
      .def_property_readonly("stop_reason",
                             [](const api::CompletionOutput& o) -> py::object {
                               if (o.stop_string) return py::str(*o.stop_string);
                               if (o.stop_token_id) return py::int_(*o.stop_token_id);
                               return py::none();
                             })
      .def_readonly("engine_stop_reason", &api::CompletionOutput::engine_stop_reason)
      .def_property_readonly("logprobs",
                             [](const api::CompletionOutput& o) { return logprobs_to_py(o.has_logprobs, o.logprobs); })
      .def_property_readonly("cumulative_logprob",
                             [](const api::CompletionOutput& o) -> py::object {
                               if (!o.has_logprobs) return py::none();
                               double s = 0;
                               for (const auto& r : o.logprobs) s += r.logprob;
                               return py::float_(s);
                             })
      .def_readonly("decode_ppl", &api::CompletionOutput::decode_ppl)
      .def_readonly("num_cached_prompt_tokens", &api::CompletionOutput::num_cached_prompt_tokens)
      .def_readonly("num_preemptions", &api::CompletionOutput::num_preemptions)
      .def("__repr__", [](const api::CompletionOutput& o) {
        return "CompletionOutput(index=" + std::to_string(o.index) +
               ", text=" + std::string(py::repr(py::str(o.text))) + ", token_ids=" + ids_repr(o.token_ids) +
               ", finish_reason=" + (o.finish_reason.empty() ? "None" : "'" + o.finish_reason + "'") + ")";
      });

  py::class_<api::RequestOutput>(m, "RequestOutput", "The outputs of one prompt, in input order")
      .def_readonly("index", &api::RequestOutput::index)
      .def_readonly("request_id", &api::RequestOutput::request_id)
      .def_readonly("prompt", &api::RequestOutput::prompt)
      .def_readonly("prompt_token_ids", &api::RequestOutput::prompt_token_ids)
      .def_readonly("outputs", &api::RequestOutput::outputs)
      .def_readonly("finished", &api::RequestOutput::finished)
      .def_readonly("acceptance_rate", &api::RequestOutput::acceptance_rate,
                    "accepted / verified drafts over the finished samples; None without speculative decoding")
      .def_readonly("num_draft_tokens", &api::RequestOutput::num_draft_tokens)
      .def_readonly("num_accepted_tokens", &api::RequestOutput::num_accepted_tokens)
      .def("__repr__", [](const api::RequestOutput& r) {
        return "RequestOutput(index=" + std::to_string(r.index) + ", prompt_token_ids=" + ids_repr(r.prompt_token_ids) +
               ", outputs=" + std::to_string(r.outputs.size()) +
               " samples, finished=" + (r.finished ? "True" : "False") + ")";
      });

  py::class_<api::StreamDelta>(m, "StreamDelta", "New output of one sample, as the engine produced it")
      .def_readonly("index", &api::StreamDelta::index)
      .def_readonly("sample_index", &api::StreamDelta::sample_index)
      .def_readonly("token_ids", &api::StreamDelta::token_ids)
      .def_readonly("text", &api::StreamDelta::text)
      .def_property_readonly("logprobs",
                             [](const api::StreamDelta& d) { return logprobs_to_py(d.has_logprobs, d.logprobs); })
      .def_readonly("finished", &api::StreamDelta::finished)
      .def_property_readonly("finish_reason",
                             [](const api::StreamDelta& d) -> py::object {
                               if (d.finish_reason.empty()) return py::none();
                               return py::str(d.finish_reason);
                             })
      .def_property_readonly(
          "request_output",
          [](const api::StreamDelta& d) -> py::object {
            if (!d.request_output) return py::none();
            return py::cast(*d.request_output);
          },
          "the whole RequestOutput on the delta that finished the request's last sample, else None")
      .def("__repr__", [](const api::StreamDelta& d) {
        return "StreamDelta(index=" + std::to_string(d.index) + ", sample_index=" + std::to_string(d.sample_index) +
               ", token_ids=" + ids_repr(d.token_ids) + ", text=" + std::string(py::repr(py::str(d.text))) +
               ", finished=" + (d.finished ? "True" : "False") + ")";
      });

  py::class_<PyStream>(m, "GenerationStream", "Iterator of StreamDelta; close() aborts what is unfinished")
      .def("__iter__", [](PyStream& s) -> PyStream& { return s; })
      .def("__next__",
           [](PyStream& s) {
             std::optional<api::StreamDelta> d;
             {
               py::gil_scoped_release release;
               d = s.stream->next();
             }
             if (!d) throw py::stop_iteration();
             return std::move(*d);
           })
      .def("close",
           [](PyStream& s) {
             py::gil_scoped_release release;
             s.stream->close();
           })
      .def_property_readonly("closed", [](const PyStream& s) { return s.stream->closed(); })
      .def("__enter__", [](PyStream& s) -> PyStream& { return s; })
      .def("__exit__", [](PyStream& s, py::args) {
        py::gil_scoped_release release;
        s.stream->close();
      });

  py::class_<api::Llm>(m, "Llm", "The engine over one model directory (use deepinfer.LLM)")
      .def(
          py::init([](std::string model_dir, std::string device, int threads, int64_t max_model_len, int max_num_seqs,
                      int64_t max_num_batched_tokens, double gpu_memory_utilization, int64_t kv_cache_bytes, int ep,
                      int dp, int cp, uint64_t seed, std::string chat_format, bool exact_prefill,
                      std::string speculative, int num_draft_tokens, bool batch_invariant, std::string activation_quant,
                      std::vector<std::string> kernel_choices, std::string kv_cache_dtype) {
            api::LlmConfig c;
            c.model_dir = std::move(model_dir);
            c.device = std::move(device);
            c.threads = threads;
            c.max_model_len = max_model_len;
            c.max_num_seqs = max_num_seqs;
            c.max_num_batched_tokens = max_num_batched_tokens;
            c.gpu_memory_utilization = gpu_memory_utilization;
            c.kv_cache_bytes = kv_cache_bytes;
            c.ep = ep;
            c.dp = dp;
            c.cp = cp;
            c.seed = seed;
            c.chat_format = std::move(chat_format);
            c.exact_prefill = exact_prefill;
            c.speculative = std::move(speculative);
            c.num_draft_tokens = num_draft_tokens;
            c.batch_invariant = batch_invariant;
            c.activation_quant = std::move(activation_quant);
            c.kernel_choices = std::move(kernel_choices);
            c.kv_cache_dtype = std::move(kv_cache_dtype);
            py::gil_scoped_release release;
            return std::make_unique<api::Llm>(std::move(c));
          }),
          py::arg("model_dir"), py::arg("device"), py::arg("threads"), py::arg("max_model_len"),
          py::arg("max_num_seqs"), py::arg("max_num_batched_tokens"), py::arg("gpu_memory_utilization"),
          py::arg("kv_cache_bytes"), py::arg("ep"), py::arg("dp"), py::arg("cp"), py::arg("seed"),
          py::arg("chat_format"), py::arg("exact_prefill"), py::arg("speculative"), py::arg("num_draft_tokens"),
          py::arg("batch_invariant") = false, py::arg("activation_quant") = "none",
          py::arg("kernel_choices") = std::vector<std::string>{}, py::arg("kv_cache_dtype") = "auto")
      .def(
          "generate",
          [](api::Llm& llm, const py::sequence& prompts, const std::vector<SamplingParams>& params,
             const py::object& progress) {
            std::vector<api::PromptInput> in = to_prompts(prompts);
            // Called once per engine step with the GIL: reports progress and lets Ctrl-C cancel the call.
            api::ProgressFn fn = [&progress](int64_t finished, int64_t total) {
              py::gil_scoped_acquire gil;
              if (PyErr_CheckSignals() != 0) throw py::error_already_set();
              if (!progress.is_none()) progress(finished, total);
            };
            std::vector<api::RequestOutput> out;
            {
              py::gil_scoped_release release;
              out = llm.generate(in, params, fn);
            }
            return out;
          },
          py::arg("prompts"), py::arg("params"), py::arg("progress") = py::none())
      .def(
          "generate_stream",
          [](api::Llm& llm, const py::sequence& prompts, const std::vector<SamplingParams>& params) {
            std::vector<api::PromptInput> in = to_prompts(prompts);
            auto s = std::make_unique<PyStream>();
            py::gil_scoped_release release;
            s->stream = llm.generate_stream(in, params);
            return s;
          },
          py::arg("prompts"), py::arg("params"), py::keep_alive<0, 1>())
      .def("encode", &api::Llm::encode, py::arg("text"), py::call_guard<py::gil_scoped_release>())
      .def("decode", &api::Llm::decode, py::arg("token_ids"), py::arg("skip_special_tokens") = false,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "encode_chat",
          [](const api::Llm& llm, const std::string& request_json) {
            nlohmann::ordered_json j;
            try {
              j = nlohmann::ordered_json::parse(request_json);
            } catch (const nlohmann::json::exception& e) {
              throw py::value_error(std::string("chat request is not valid JSON: ") + e.what());
            }
            py::gil_scoped_release release;
            return llm.encode_chat(j);
          },
          py::arg("request_json"))
      .def_property_readonly("chat_format", &api::Llm::chat_format_name)
      .def_property_readonly("has_tokenizer", &api::Llm::has_tokenizer)
      .def_property_readonly("max_model_len", &api::Llm::max_model_len)
      .def_property_readonly("vocab_size", [](const api::Llm& l) { return l.model_config().vocab_size; })
      .def_property_readonly("model_type", [](const api::Llm& l) { return l.model_config().model_type; })
      .def_property_readonly("eos_token_ids", [](const api::Llm& l) { return l.model_config().eos_token_ids; })
      .def_property_readonly("model_dir", [](const api::Llm& l) { return l.config().model_dir; })
      .def_property_readonly("device", [](const api::Llm& l) { return l.config().device; })
      .def("stats", [](const api::Llm& l) {
        EngineStats s = l.stats();
        py::dict d;
        d["steps"] = s.steps;
        d["prompt_tokens_computed"] = s.prompt_tokens_computed;
        d["generated_tokens"] = s.generated_tokens;
        d["preemptions"] = s.preemptions;
        d["prefix_cache_hit_rate"] = s.kv.hit_rate();
        // GPU idle between decode steps (CUDA; engine/gpu_idle.h): None on the CPU backend.
        const ModelWorkStats& w = s.model;
        d["gpu_timed_decode_steps"] = w.gpu_timed_decode_steps;
        d["gpu_decode_gap_seconds"] = w.gpu_decode_gap_seconds;
        d["gpu_decode_span_seconds"] = w.gpu_decode_span_seconds;
        d["gpu_idle_between_decode_steps"] =
            w.gpu_decode_span_seconds > 0 ? py::object(py::float_(w.gpu_decode_gap_seconds / w.gpu_decode_span_seconds))
                                          : py::object(py::none());
        return d;
      });
}
