#include "deepinfer/parallel/parallel_model_runner.h"

#include <thread>

#include "deepinfer/model/deepseek_v3.h"
#include "deepinfer/model/deepseek_v4.h"

namespace deepinfer {

std::vector<ExpertPlacement> initial_placements(const ModelConfig& config, int ep_size) {
  std::vector<ExpertPlacement> out(config.layers.size());
  for (size_t l = 0; l < config.layers.size(); ++l) {
    if (config.layers[l].routing == RoutingKind::kDense) continue;
    out[l] = ExpertPlacement::contiguous(config.moe.n_routed_experts, ep_size);
  }
  return out;
}

ParallelJob ParallelDriver::step_job(const ModelBatch& batch) {
  ParallelJob job;
  job.kind = ParallelJob::Kind::kStep;
  job.block_size = batch.block_size;
  job.prev_sampled_tokens.assign(batch.prev_sampled_tokens.begin(), batch.prev_sampled_tokens.end());
  for (const BatchEntry& e : batch.entries) {
    ParallelJob::Entry j = job_entry(e);
    j.shard = balancer_.assign(e.seq_id, std::max<int64_t>(e.prompt_len, e.end()));
    slot_seq_[e.state_slot] = e.seq_id;
    if (e.needs_logits) j.logit_row = job.num_logits_rows++;
    job.entries.push_back(std::move(j));
  }
  return job;
}

void ParallelDriver::released(int32_t slot) {
  auto it = slot_seq_.find(slot);
  if (it == slot_seq_.end()) return;
  balancer_.release(it->second);
  slot_seq_.erase(it);
}

std::optional<ParallelJob> ParallelDriver::eplb_job(const ModelConfig& config) {
  if (options_.eplb_interval <= 0 || ++steps_ % options_.eplb_interval != 0) return std::nullopt;
  ParallelJob job;
  job.kind = ParallelJob::Kind::kRebalance;
  job.slots_per_rank = options_.eplb_slots > 0 ? options_.eplb_slots : default_eplb_slots(config, options_.layout.ep);
  return job;
}

int default_eplb_slots(const ModelConfig& config, int ep_size) {
  const int E = config.moe.n_routed_experts;
  return std::min(E, (E + ep_size - 1) / ep_size + 1);
}

std::unique_ptr<ModelRunner> make_parallel_runner(const ParallelRunnerOptions& options, int threads,
                                                  std::optional<std::vector<int64_t>> token_map) {
  const ModelConfig config = load_model_config(options.model_dir + "/config.json");
  const ParallelLayout& L = options.layout;
  DI_CHECK(config.moe.n_routed_experts >= L.ep)
      << "--ep " << L.ep << ": the model has only " << config.moe.n_routed_experts
      << " routed experts per layer (each EP rank needs at least one)";
  const int total = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int per_rank = std::max(1, total / L.world);
  auto backend = [per_rank](int) { return make_cpu_backend(per_rank); };
  const std::string dir = options.model_dir;
  const bool quant = options.keep_quant;
  const ActQuant act_quant = options.act_quant;
  const DType kv_dtype = options.kv_cache_dtype;
  if (config.family == ModelFamily::kDeepseekV3) {
    return std::make_unique<ParallelModelRunner<DeepseekV3Model>>(
        options, backend, [dir, quant, act_quant, kv_dtype](Backend& b, const ExpertFilter& resident) {
          auto model = DeepseekV3Model::load(dir, b, quant ? V3WeightStorage::kFP8 : V3WeightStorage::kF32, resident);
          model->set_activation_quant(act_quant);
          model->set_kv_cache_dtype(kv_dtype);
          return model;
        });
  }
  return std::make_unique<ParallelModelRunner<DeepseekV4Model>>(
      options, backend, [dir, token_map, quant, act_quant, kv_dtype](Backend& b, const ExpertFilter& resident) {
        auto model = DeepseekV4Model::load(dir, b, token_map, quant, resident);
        model->set_activation_quant(act_quant);
        model->set_kv_cache_dtype(kv_dtype);
        return model;
      });
}

}  // namespace deepinfer
