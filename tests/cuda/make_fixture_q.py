#!/usr/bin/env python3
# Copy of /work/shared/fixtures/make_fixture.py (the project's fixture script) with one change:
# the MLX reference uses the stored bf16(1+w) norms (deq_sd), not the unrounded w.
"""Build a small random checkpoint of the Qwen3.5/3.6-MoE architecture, saved the way the
official release is saved (multimodal config, `model.language_model.*` names, sharded
safetensors, bf16), plus reference outputs computed by the Hugging Face transformers
implementation from the very same bf16 weights, in float64 except for the parts that
transformers itself computes in float32 (rope tables, router softmax, decay, delta rule):
the reference is good to about 1e-6 relative.

Runs where torch and transformers (>= 5.x, with qwen3_5_moe) are installed, e.g. the GPU
machine. Usage:
  make_fixture.py OUT_DIR --seed 1 --hidden 128 --layers 8 --experts 16 --topk 4 \
      --moe-inter 32 --vocab 512 --prefill 100 --cont 37 --gen 24 --shard 3MB

Reference tensors in OUT_DIR/reference.safetensors (all float32 / int32):
  prompt_ids [P]            token ids of the first prefill
  logits_prefill [P, V]     logits at every prompt position
  hidden_prefill [L+1, P, H] hidden_states: embeddings, the input of layers 1..L-1, the final norm's output
  cont_ids [C]              a second chunk fed after the first, reusing the caches
  logits_cont [C, V]
  gen_ids [G]               greedy tokens decoded one at a time after that
  logits_gen [G, V]         logits that chose each of gen_ids
"""
import argparse, json, math, os
import torch
from safetensors.torch import save_file
from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration
from transformers.cache_utils import DynamicCache

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--seed", type=int, default=1)
p.add_argument("--hidden", type=int, default=128)
p.add_argument("--layers", type=int, default=8)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--kv-heads", type=int, default=2)
p.add_argument("--lin-k-heads", type=int, default=2)
p.add_argument("--lin-v-heads", type=int, default=4)
p.add_argument("--experts", type=int, default=16)
p.add_argument("--topk", type=int, default=4)
p.add_argument("--moe-inter", type=int, default=32)
p.add_argument("--vocab", type=int, default=512)
p.add_argument("--prefill", type=int, default=100)
p.add_argument("--cont", type=int, default=37)
p.add_argument("--gen", type=int, default=24)
p.add_argument("--shard", default="3MB")
p.add_argument("--layout", choices=["fused", "per-expert"], default="fused",
               help="fused: experts stored as the official release stores them")
p.add_argument("--mlx4", action="store_true",
               help="also write OUT_DIR-mlx4: the same model in the MLX affine 4-bit layout")
a = p.parse_args()
torch.manual_seed(a.seed)

text = dict(
    vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
    num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=256,
    linear_num_key_heads=a.lin_k_heads, linear_num_value_heads=a.lin_v_heads,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    num_experts=a.experts, num_experts_per_tok=a.topk, moe_intermediate_size=a.moe_inter,
    shared_expert_intermediate_size=a.moe_inter, rms_norm_eps=1e-6,
    max_position_embeddings=262144, tie_word_embeddings=False,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                         mrope_section=[11, 11, 10], mrope_interleaved=True),
    full_attention_interval=4,
)
vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
              out_hidden_size=a.hidden, num_position_embeddings=64)
cfg = Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
model = Qwen3_5MoeForConditionalGeneration(cfg).float().eval()
# The per-expert loop is the plain reference path and the only one that runs in float64.
if hasattr(model, "set_experts_implementation"):
    model.set_experts_implementation("eager")
else:
    for c in (cfg, cfg.text_config):
        c._experts_implementation = "eager"

# Random weights of a scale that keeps every layer's contribution visible in the logits.
with torch.no_grad():
    for name, t in model.named_parameters():
        if name.endswith("A_log"):
            t.copy_(torch.log(torch.empty_like(t).uniform_(1.0, 16.0)))
        elif name.endswith("dt_bias"):
            t.normal_(0.0, 0.5)
        elif "linear_attn.norm.weight" in name:
            t.copy_(1.0 + 0.1 * torch.randn_like(t))
        elif "norm" in name and t.dim() == 1:          # (1 + w) RMSNorms
            t.normal_(0.0, 0.1)
        elif "conv1d" in name:
            t.normal_(0.0, 0.5)
        elif "embed_tokens" in name:
            t.normal_(0.0, 1.0)
        elif name.endswith("mlp.gate.weight"):         # router: decisive but varied
            t.normal_(0.0, 2.0 / math.sqrt(t.shape[-1]))
        elif t.dim() >= 2:
            t.normal_(0.0, 1.0 / math.sqrt(t.shape[-1]))
model = model.to(torch.bfloat16)
os.makedirs(a.out, exist_ok=True)
model.save_pretrained(a.out, max_shard_size=a.shard)
MAX_SHARD = int(a.shard.rstrip("MB")) * 1000 * 1000


def write_sharded(out, tensors):
    """Write tensors as sharded safetensors plus model.safetensors.index.json."""
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f.endswith(".index.json"):
            os.remove(os.path.join(out, f))
    shards, cur, size = [], {}, 0
    for k in sorted(tensors):
        n = tensors[k].numel() * tensors[k].element_size()
        if cur and size + n > MAX_SHARD:
            shards.append(cur); cur, size = {}, 0
        cur[k] = tensors[k].contiguous(); size += n
    shards.append(cur)
    wmap, total = {}, 0
    for i, sh in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, os.path.join(out, fn), metadata={"format": "pt"})
        for k, t in sh.items():
            wmap[k] = fn; total += t.numel() * t.element_size()
    json.dump({"metadata": {"total_size": total}, "weight_map": wmap},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=2)


# In memory (as in the release) the experts of a layer are two 3-D tensors:
# experts.gate_up_proj [E, 2I, H] (gate rows first) and experts.down_proj [E, H, I].
sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
E, I = a.experts, a.moe_inter
official = {}
for k, v in sd.items():
    if k.endswith("A_log") or k.endswith("linear_attn.norm.weight"):
        v = v.float()                       # the release keeps these two in float32
    official[k] = v
if a.layout == "per-expert":                # the older one-tensor-per-expert layout
    for l in range(a.layers):
        pre = f"model.language_model.layers.{l}.mlp.experts."
        gu, dn = official.pop(pre + "gate_up_proj"), official.pop(pre + "down_proj")
        for e in range(E):
            official[f"{pre}{e}.gate_proj.weight"] = gu[e, :I].clone()
            official[f"{pre}{e}.up_proj.weight"] = gu[e, I:].clone()
            official[f"{pre}{e}.down_proj.weight"] = dn[e].clone()
write_sharded(a.out, official)

# Reference in float64 from the bf16 values.
m = model.to(torch.float64)
lm = m.model.language_model
head = m.lm_head
g = torch.Generator().manual_seed(a.seed + 1000)
prompt = torch.randint(0, a.vocab, (1, a.prefill), generator=g)
cont = torch.randint(0, a.vocab, (1, a.cont), generator=g)

with torch.no_grad():
    cache = DynamicCache(config=cfg.text_config)
    out = lm(input_ids=prompt, past_key_values=cache, use_cache=True, output_hidden_states=True)
    logits_prefill = head(out.last_hidden_state)[0]
    hidden_prefill = torch.stack([h[0] for h in out.hidden_states[: a.layers + 1]])
    out = lm(input_ids=cont, past_key_values=cache, use_cache=True)
    logits_cont = head(out.last_hidden_state)[0]
    nxt = logits_cont[-1].argmax()
    gen, logits_gen = [], []
    for _ in range(a.gen):
        gen.append(int(nxt))
        out = lm(input_ids=nxt.view(1, 1), past_key_values=cache, use_cache=True)
        lg = head(out.last_hidden_state)[0, -1]
        logits_gen.append(lg)
        nxt = lg.argmax()
    logits_gen = torch.stack(logits_gen)
    gen_ids = torch.tensor(gen)
    # Self-check: one uncached pass over everything must agree with the cached phases.
    full = torch.cat([prompt[0], cont[0], gen_ids[:-1]]).view(1, -1)
    lf = head(lm(input_ids=full, use_cache=False).last_hidden_state)[0]
    ref = torch.cat([logits_prefill, logits_cont, logits_gen[:-1]])
    err = ((lf - ref).norm() / ref.norm()).item()
    print("cached vs uncached relative error:", err)
    # transformers computes rope tables, router softmax, decay and the delta rule in float32
    assert err < 1e-5, err

save_file({
    "prompt_ids": prompt[0].to(torch.int32), "logits_prefill": logits_prefill.float(),
    "hidden_prefill": hidden_prefill.float(),
    "cont_ids": cont[0].to(torch.int32), "logits_cont": logits_cont.float(),
    "gen_ids": gen_ids.to(torch.int32), "logits_gen": logits_gen.float(),
}, os.path.join(a.out, "reference.safetensors"))
json.dump(vars(a), open(os.path.join(a.out, "fixture_args.json"), "w"), indent=1)


def quantize(w, bits):
    """MLX affine quantization along the last dim in groups of 64: w ~ scale * q + bias.
    Returns (packed uint32 codes, scales, biases, dequantized float64 weight)."""
    shape = w.shape
    g = w.float().reshape(-1, 64)
    lo, hi = g.min(1, keepdim=True).values, g.max(1, keepdim=True).values
    levels = 2 ** bits - 1
    scale = ((hi - lo) / levels).clamp_min(1e-8).to(torch.bfloat16)
    bias = lo.to(torch.bfloat16)
    q = ((g - bias.float()) / scale.float()).round().clamp(0, levels).to(torch.int64)
    deq = (q.double() * scale.double() + bias.double()).reshape(shape)
    per = 32 // bits
    q = q.reshape(-1, per)
    packed = torch.zeros(q.shape[0], dtype=torch.int64)
    for j in range(per):                      # element j of a word sits at bits [j*bits, (j+1)*bits)
        packed |= q[:, j] << (bits * j)
    packed = packed.to(torch.uint32).reshape(*shape[:-1], shape[-1] // per)
    return packed, scale.reshape(*shape[:-1], -1), bias.reshape(*shape[:-1], -1), deq


if a.mlx4:
    out4 = a.out.rstrip("/") + "-mlx4"
    os.makedirs(out4, exist_ok=True)
    mlx, deq_sd = {}, {}
    qcfg = {"group_size": 64, "bits": 4}
    for k, v in sd.items():
        if k.startswith("model.visual"):
            continue
        nk = k.replace("model.language_model.", "language_model.model.")
        nk = "language_model.lm_head.weight" if k == "lm_head.weight" else nk
        if nk.endswith("mlp.experts.gate_up_proj"):
            stem = nk[: -len("experts.gate_up_proj")] + "switch_mlp."
            deq = []
            for part, w in (("gate_proj", v[:, :I]), ("up_proj", v[:, I:])):
                pk, sc, bi, dq = quantize(w, 4)
                mlx[stem + part + ".weight"], mlx[stem + part + ".scales"], mlx[stem + part + ".biases"] = pk, sc, bi
                deq.append(dq)
            deq_sd[k] = torch.cat(deq, dim=1)
            continue
        if nk.endswith("mlp.experts.down_proj"):
            stem = nk[: -len("experts.down_proj")] + "switch_mlp.down_proj."
            pk, sc, bi, dq = quantize(v, 4)
            mlx[stem + "weight"], mlx[stem + "scales"], mlx[stem + "biases"] = pk, sc, bi
            deq_sd[k] = dq
            continue
        if v.dim() == 2 and v.shape[-1] % 64 == 0:
            bits = 8 if (nk.endswith("mlp.gate.weight") or nk.endswith("shared_expert_gate.weight")) else 4
            if bits == 8:
                qcfg[nk[: -len(".weight")]] = {"group_size": 64, "bits": 8}
            pk, sc, bi, dq = quantize(v, bits)
            stem = nk[: -len("weight")]
            mlx[stem + "weight"], mlx[stem + "scales"], mlx[stem + "biases"] = pk, sc, bi
            deq_sd[k] = dq
            continue
        t = v
        if "conv1d.weight" in nk:
            t = t.movedim(2, 1)                   # [C, 1, K] -> [C, K, 1]
        elif t.dim() == 1 and any(nk.endswith(s) for s in (
                ".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                ".q_norm.weight", ".k_norm.weight")):
            t = (t.float() + 1.0).to(torch.bfloat16)   # MLX stores 1 + w
            deq_sd[k] = t.double() - 1.0              # the reference uses exactly what the file stores
        if nk.endswith("A_log"):
            t = t.float()
        mlx[nk] = t
    write_sharded(out4, mlx)
    c4 = json.load(open(os.path.join(a.out, "config.json")))
    c4["quantization"] = qcfg
    c4["quantization_config"] = qcfg
    json.dump(c4, open(os.path.join(out4, "config.json"), "w"), indent=2)
    # Reference for the quantized model: transformers on the dequantized weights.
    sd64 = {k: v.double() for k, v in sd.items()}
    sd64.update(deq_sd)
    m.load_state_dict(sd64)
    with torch.no_grad():
        cache = DynamicCache(config=cfg.text_config)
        lp = head(lm(input_ids=prompt, past_key_values=cache, use_cache=True).last_hidden_state)[0]
        lc = head(lm(input_ids=cont, past_key_values=cache, use_cache=True).last_hidden_state)[0]
        nxt, g4, lg4 = lc[-1].argmax(), [], []
        for _ in range(a.gen):
            g4.append(int(nxt))
            lg = head(lm(input_ids=nxt.view(1, 1), past_key_values=cache,
                         use_cache=True).last_hidden_state)[0, -1]
            lg4.append(lg); nxt = lg.argmax()
    save_file({"prompt_ids": prompt[0].to(torch.int32), "logits_prefill": lp.float(),
               "cont_ids": cont[0].to(torch.int32), "logits_cont": lc.float(),
               "gen_ids": torch.tensor(g4, dtype=torch.int32),
               "logits_gen": torch.stack(lg4).float()},
              os.path.join(out4, "reference.safetensors"))
    err = ((lp - logits_prefill).norm() / logits_prefill.norm()).item()
    print("mlx4: relative logit change from quantization:", err, "greedy:", g4)
print("greedy tokens:", gen)
print("files:", sorted(os.listdir(a.out)))
