"""PyTorch reference for the tiny model's MTP drafts: greedy generation from the prompt in argv[1] (a text file),
then the MTP draft of t[i+2] at every position and the acceptance of the one-draft speculative schedule. Reuses the
training script's MTP module (tools/train_tiny_v3.py); needs torch, transformers, safetensors, tokenizers. Run from
the repository root: python3 tools/mtp_reference.py PROMPT_FILE [MAX_TOKENS]."""
import sys, os, json, torch
sys.path.insert(0, "tools")
import train_tiny_v3 as tt
from safetensors.torch import load_file
from transformers import DeepseekV3ForCausalLM
from tokenizers import Tokenizer
M = "models/deepinfer-tiny-v3"
model = DeepseekV3ForCausalLM.from_pretrained(M, dtype=torch.float32, attn_implementation="sdpa").eval()
cfg = model.config
mtp = tt.MTP(cfg)
files = sorted(set(json.load(open(M + "/model.safetensors.index.json"))["weight_map"].values()))
sd = {}
for f in files: sd.update(load_file(os.path.join(M, f)))
P = f"model.layers.{cfg.num_hidden_layers}."
m = {k[len(P):]: v.float() for k, v in sd.items() if k.startswith(P)}
E = cfg.n_routed_experts
state = {"enorm.weight": m["enorm.weight"], "hnorm.weight": m["hnorm.weight"], "eh_proj.weight": m["eh_proj.weight"],
         "head_norm.weight": m["shared_head.norm.weight"],
         "block.mlp.experts.gate_up_proj": torch.stack([torch.cat([m[f"mlp.experts.{e}.gate_proj.weight"], m[f"mlp.experts.{e}.up_proj.weight"]]) for e in range(E)]),
         "block.mlp.experts.down_proj": torch.stack([m[f"mlp.experts.{e}.down_proj.weight"] for e in range(E)])}
skip = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.", "mlp.experts.")
state.update({"block." + k: v for k, v in m.items() if not k.startswith(skip)})
mtp.load_state_dict(state, strict=True); mtp.eval()
tok = Tokenizer.from_file(M + "/tokenizer.json")
text = open(sys.argv[1]).read().strip()
ids = tok.encode(text).ids
print("prompt ids", ",".join(map(str, ids)))
with torch.no_grad():
    seqs = torch.tensor([ids])
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 48):
        seqs = torch.cat([seqs, model(input_ids=seqs).logits[:, -1].argmax(-1, keepdim=True)], 1)
    T = seqs.shape[1]; pos = torch.arange(T)[None]
    hidden = model.model(input_ids=seqs, position_ids=pos).last_hidden_state
    nxt = torch.cat([seqs[:, 1:], seqs[:, -1:]], 1)
    draft = mtp(model, hidden, nxt, pos).argmax(-1)[0].tolist()
s = seqs[0].tolist(); Pn = len(ids)
print("gen", ",".join(map(str, s[Pn:])))
allpos = [draft[i] == s[i + 2] for i in range(Pn - 1, T - 2)]
print("all positions:", sum(allpos), "/", len(allpos))
i = Pn - 1; acc = n = 0
while i + 2 < T:
    n += 1
    if draft[i] == s[i + 2]: acc += 1; i += 2
    else: i += 1
print("k=1 schedule:", acc, "/", n)
