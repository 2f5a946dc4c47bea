#!/usr/bin/env python3
"""Tiny random Qwen2-MoE reference for dustoff's tests (tests/arch_qwen2_moe.rs).

Builds a small `Qwen2MoeForCausalLM` with transformers (random weights, fixed seed), writes it
as a Hugging Face directory (BF16 safetensors, one tensor per expert as the released Qwen2-MoE
checkpoints store them, config.json, the byte-level BPE tokenizer of the shared tiny references)
and computes `refs.jsonl` with transformers in float32, in the format of
../shared/testdata/arch/README.md (fields `name` ... `router_min_gap`).

Usage (CPU, about a minute):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers safetensors
    /tmp/venv/bin/python scripts/arch-ref/qwen2moe.py --tokenizer ../shared/testdata/arch/qwen3_moe/hf \
        --refs-from ../shared/testdata/arch/qwen3_moe/refs.jsonl --out tests/data/arch/qwen2_moe

What the model exercises: Qwen2 attention with Q/K/V biases (random, non-zero), GQA 2:1, head
size 64 (q width 128 = 2 x hidden); 3 layers of which layer 1 is dense (`mlp_only_layers`);
the sparse layers route over 4 experts, top 2, not renormalised (`norm_topk_prob` false, the
family's default), plus a shared expert of width 48 (the routed ones are 32 wide) gated by
sigmoid(shared_expert_gate . x); untied head.
"""

import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

SEED = 20261203
N_GREEDY = 32
# A prompt variant is kept when every greedy margin is at least this and every router choice
# of the teacher-forced pass has a gap (k-th minus (k+1)-th router logit) at least ROUTER_GAP.
MIN_MARGIN = 0.05
ROUTER_GAP = 3e-4
PREFIXES = ["", "Note: ", "Draft 2. ", "Today, ", "Again: ", "Copy: ", "Then ", "Read: ", "Here: ", "Also, "]


def config():
    return Qwen2MoeConfig(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
        tie_word_embeddings=False,
        use_sliding_window=False,
        decoder_sparse_step=1,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_experts_per_tok=2,
        num_experts=4,
        norm_topk_prob=False,
        mlp_only_layers=[1],
        qkv_bias=True,
        bos_token_id=2045,
        eos_token_id=2047,
    )


def randomize(model):
    """Weights of unit-variance outputs (std 1/sqrt(fan_in)), the head 8x that so that logits
    reach about +-30 as in the shared references (clear greedy margins); norms 1 + 0.1 N(0,1); Q/K/V biases 0.1 N(0,1)."""
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                scale = 8.0 if name == "lm_head.weight" else 1.0
                p.copy_(scale * torch.randn(p.shape, generator=g) / fan_in**0.5)


def checkpoint_tensors(model):
    """The state dict under the released checkpoints' names, BF16: fused experts
    (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]) split per expert."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().to(torch.bfloat16).contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t
    return out


def write_hf(model, cfg, tok_dir, out):
    hf = os.path.join(out, "hf")
    os.makedirs(hf, exist_ok=True)
    save_file(checkpoint_tensors(model), os.path.join(hf, "model.safetensors"), metadata={"format": "pt"})
    c = cfg.to_dict()
    c["architectures"] = ["Qwen2MoeForCausalLM"]
    c["torch_dtype"] = "bfloat16"
    c["dtype"] = "bfloat16"
    # The spelling of the released configs beside transformers 5's `rope_parameters`.
    c["rope_theta"] = 1000000.0
    c["rope_scaling"] = None
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copyfile(os.path.join(tok_dir, name), os.path.join(hf, name))
    return hf


class RouterTap:
    """Router logits of every sparse layer in the last forward pass: [tokens, experts] each."""

    def __init__(self, model):
        self.logits = []
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(layer.mlp, "shared_expert"):
                gate.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        self.logits.append(output[0].detach())

    def min_gap(self, k):
        gaps = []
        for lg in self.logits:
            top = torch.topk(lg, k + 1, dim=-1).values
            gaps.append(top[:, k - 1] - top[:, k])
        return torch.stack(gaps).min(dim=0).values


def reference(model, tap, name, text, prompt_ids, k):
    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]
        greedy, gmargins = [], []
        for _ in range(N_GREEDY):
            top = torch.topk(logits, 2).values
            tok = int(torch.argmax(logits))
            greedy.append(tok)
            gmargins.append(float(top[0] - top[1]))
            out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
        forced = prompt_ids + greedy
        tap.logits.clear()
        full = model(torch.tensor([forced]), use_cache=False).logits[0]
        gaps = tap.min_gap(k)
    top2 = torch.topk(full, 2, dim=-1).values
    r6 = lambda v: round(float(v), 6)
    top5 = []
    for pos in range(8):
        v, i = torch.topk(full[pos], 5)
        top5.append({"pos": pos, "ids": [int(x) for x in i], "logits": [r6(x) for x in v]})
    return {
        "name": name,
        "source_text": text,
        "n_prompt": len(prompt_ids),
        "prompt_ids": prompt_ids,
        "greedy_ids": greedy,
        "greedy_margins": [r6(m) for m in gmargins],
        "teacher_forced_ids": forced,
        "argmax_ids": [int(x) for x in torch.argmax(full, dim=-1)],
        "margins": [r6(x) for x in (top2[:, 0] - top2[:, 1])],
        "top5": top5,
        "prompt_last_logits": [r6(x) for x in full[len(prompt_ids) - 1]],
        "last_logits": [r6(x) for x in full[-1]],
        "router_min_gap": [r6(x) for x in gaps],
    }


def with_prefix(name, text, prefix):
    if name == "chat":
        return text.replace("user\n", "user\n" + prefix, 1)
    return prefix + text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="HF dir of the shared tiny references' tokenizer")
    ap.add_argument("--refs-from", required=True, help="refs.jsonl whose prompts (texts, lengths) to reuse")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.manual_seed(SEED)
    cfg = config()
    model = Qwen2MoeForCausalLM(cfg)
    randomize(model)
    hf = write_hf(model, cfg, a.tokenizer, a.out)
    original = model
    # The references come from the written BF16 file, read back in float32 (exact upcast).
    model = Qwen2MoeForCausalLM.from_pretrained(
        hf, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    )
    model.eval()
    # Every tensor read back is the one written (the per-expert names mapped onto the fused ones).
    written = checkpoint_tensors(model)
    for n, t in checkpoint_tensors(original).items():
        assert torch.equal(written[n], t), f"{n}: not read back as written"
    tok = Tokenizer.from_file(os.path.join(hf, "tokenizer.json"))
    tap = RouterTap(model)
    k = cfg.num_experts_per_tok
    rows = []
    for line in open(a.refs_from):
        base = json.loads(line)
        name = base["name"]
        for prefix in PREFIXES:
            text = with_prefix(name, base["source_text"], prefix)
            ids = tok.encode(text, add_special_tokens=False).ids
            n = len(ids) if name == "chat" else base["n_prompt"]
            if len(ids) < n:
                continue
            r = reference(model, tap, name, text, ids[:n], k)
            if min(r["greedy_margins"]) >= MIN_MARGIN and min(r["router_min_gap"]) >= ROUTER_GAP:
                break
            print(f"  {name} {prefix!r}: greedy margin {min(r['greedy_margins']):.3f}, router gap {min(r['router_min_gap']):.2e}")
        else:
            raise SystemExit(f"{name}: no prompt variant with clear margins and router gaps")
        print(f"{name}: prefix {prefix!r}, {r['n_prompt']} tokens, greedy margin >= {min(r['greedy_margins']):.3f}, "
              f"router gap >= {min(r['router_min_gap']):.2e}")
        rows.append(r)
    with open(os.path.join(a.out, "refs.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
