#!/usr/bin/env python3
"""Independent float64 PyTorch implementation of a Qwen3 decoder with a PEFT
LoRA adapter, used by torch_test.go to cross-check the native Go engine.

It is written from Hugging Face transformers' modeling_qwen3 (Qwen3RMSNorm,
Qwen3Attention with q_norm/k_norm over head_dim before rotate_half RoPE,
repeat_kv for grouped heads, eager attention, SwiGLU MLP, tied or untied LM
head) and PEFT's LoRA Linear (y = W x + scale * B A x, scale = lora_alpha / r,
or lora_alpha / sqrt(r) with use_rslora), not from the Go code: it must catch
convention errors a self-consistent Go implementation would not. Gradients
come from torch autograd.

Input (stdin, JSON):
  {"model_dir": str, "adapter_dir": str or null, "seqs": [[id, ...], ...],
   "loss_weights": [[w per position], ...] (optional)}
Output (stdout, JSON):
  {"logprobs": [[log p(seq[t] | seq[:t]) for each t, index 0 = 0], ...],
   "grads": {PEFT tensor name: [row-major gradient of
             sum_seq sum_t w_t * logprob_t], ...}}   (only with loss_weights
             and an adapter)

Only the Python standard library and torch are used (no safetensors, numpy or
transformers package), and only APIs present in both torch 1.13 and 2.x.
"""

import json
import math
import os
import re
import struct
import sys

import torch

DT = torch.float64

ST_DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
}


def read_safetensors(path):
    """Parses a .safetensors file: u64 LE header length, JSON header, data."""
    if sys.byteorder != "little":
        raise SystemExit("torch_check.py: needs a little-endian host")
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in ST_DTYPES:
            raise SystemExit("torch_check.py: %s: unsupported dtype %s" % (name, info["dtype"]))
        dtype, size = ST_DTYPES[info["dtype"]]
        shape = list(info["shape"])
        lo, hi = info["data_offsets"]
        count = 1
        for d in shape:
            count *= d
        if hi - lo != count * size or base + hi > len(data):
            raise SystemExit("torch_check.py: %s: bad data_offsets" % name)
        if count == 0:
            t = torch.zeros(shape, dtype=DT)
        else:
            # bytearray: frombuffer warns on read-only buffers.
            buf = bytearray(data[base + lo : base + hi])
            t = torch.frombuffer(buf, dtype=dtype).to(DT).reshape(shape)
        out[name] = t
    return out


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    # transformers' Qwen3Config defaults for keys a config.json may omit.
    c = {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "use_sliding_window": False,
    }
    c.update(raw)
    if c["num_key_value_heads"] is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if c["head_dim"] is None:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    # Newer transformers write rope_parameters instead of rope_theta.
    rp = c.get("rope_parameters")
    if isinstance(rp, dict):
        if rp.get("rope_type", "default") != "default":
            raise SystemExit("torch_check.py: rope_parameters %r not implemented" % rp)
        if "rope_theta" in rp:
            c["rope_theta"] = rp["rope_theta"]
    if (
        c["model_type"] != "qwen3"
        or c["rope_scaling"]
        or c["attention_bias"]
        or c["use_sliding_window"]
        or c["hidden_act"] != "silu"
    ):
        raise SystemExit("torch_check.py: config feature not implemented: %r" % raw)
    return c


# The seven nn.Linear modules of a Qwen3 decoder layer, by PEFT module path
# relative to the base model.
LAYER_LINEARS = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]


def peft_targets(target_modules, module_path):
    """PEFT's check_target_module_exists: a string is a full-match regex, a
    list matches the module path exactly or by a dotted suffix."""
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, module_path) is not None
    return any(module_path == t or module_path.endswith("." + t) for t in target_modules)


# The fields of PEFT's PeftConfig and LoraConfig (peft 0.6 and later) with
# the JSON types their dataclass fields take. PEFT builds LoraConfig(**json)
# and keeps a null as None, so a null is only valid where PEFT's own default
# or annotation allows None: a null rank_pattern, say, reaches
# `config.rank_pattern.keys()` when the adapter is injected and fails. The
# check follows these types rather than tolerating whatever .get() finds.
_STR, _BOOL, _DICT, _LIST = (str,), (bool,), (dict,), (list,)
_NUM = (int, float)
PEFT_FIELDS = {
    # PeftConfig
    "peft_type": (_STR, False),
    "task_type": (_STR, True),
    "base_model_name_or_path": (_STR, True),
    "revision": (_STR, True),
    "inference_mode": (_BOOL, False),
    "auto_mapping": (_DICT, True),
    "peft_version": (_STR, True),
    # LoraConfig
    "r": ((int,), False),
    "lora_alpha": (_NUM, False),
    "lora_dropout": (_NUM, False),
    "target_modules": (_LIST + _STR, True),
    "exclude_modules": (_LIST + _STR, True),
    "fan_in_fan_out": (_BOOL, False),
    "bias": (_STR, False),
    "use_rslora": (_BOOL, False),
    "modules_to_save": (_LIST, True),
    "init_lora_weights": (_BOOL + _STR, False),
    "layers_to_transform": (_LIST + (int,), True),
    "layers_pattern": (_LIST + _STR, True),
    "rank_pattern": (_DICT, False),
    "alpha_pattern": (_DICT, False),
    "megatron_config": (_DICT, True),
    "megatron_core": (_STR, True),
    "loftq_config": (_DICT, False),
    "use_dora": (_BOOL, False),
    "layer_replication": (_LIST, True),
    "lora_bias": (_BOOL, False),
    "use_qalora": (_BOOL, False),
    "qalora_group_size": ((int,), False),
    "eva_config": (_DICT, True),
    "corda_config": (_DICT, True),
    "trainable_token_indices": (_LIST + _DICT, True),
}


def check_peft_types(ac):
    """Refuses an adapter_config.json that PEFT's LoraConfig would not hold
    with the types its code relies on."""
    if not isinstance(ac, dict):
        raise SystemExit("torch_check.py: adapter_config.json is not an object")
    for key, value in ac.items():
        if key not in PEFT_FIELDS:
            raise SystemExit("torch_check.py: adapter_config.json: %r is not a LoraConfig field" % key)
        types, nullable = PEFT_FIELDS[key]
        if value is None:
            if not nullable:
                raise SystemExit("torch_check.py: adapter_config.json: %s is null; PEFT needs %s" % (key, "/".join(t.__name__ for t in types)))
            continue
        # bool is an int in Python; PEFT's int fields never take one.
        if isinstance(value, bool) and bool not in types:
            raise SystemExit("torch_check.py: adapter_config.json: %s is %r, not %s" % (key, value, types))
        if not isinstance(value, types):
            raise SystemExit("torch_check.py: adapter_config.json: %s is %r, not %s" % (key, value, types))
    for key in ("peft_type", "r", "lora_alpha", "target_modules"):
        if ac.get(key) is None:
            raise SystemExit("torch_check.py: adapter_config.json lacks %s" % key)
    # What PEFT's LoraModel does with them when it injects the adapter.
    for pattern in ("rank_pattern", "alpha_pattern"):
        list(ac.get(pattern, {}).keys())


def load_adapter(adapter_dir, cfg):
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        ac = json.load(f)
    check_peft_types(ac)
    unsupported = (
        ac["peft_type"] != "LORA"
        or ac.get("use_dora", False)
        or ac.get("bias", "none") != "none"
        or ac.get("fan_in_fan_out", False)
        or ac.get("modules_to_save") is not None
        or ac.get("layers_to_transform") is not None
        or ac.get("rank_pattern", {})
        or ac.get("alpha_pattern", {})
        or ac.get("lora_bias", False)
    )
    if unsupported:
        raise SystemExit("torch_check.py: adapter feature not implemented: %r" % ac)
    r = ac["r"]
    alpha = ac["lora_alpha"]
    scale = alpha / math.sqrt(r) if ac.get("use_rslora", False) else alpha / r
    tensors = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    lora = {}
    used = set()
    for l in range(cfg["num_hidden_layers"]):
        for mod in LAYER_LINEARS:
            path = "model.layers.%d.%s" % (l, mod)
            if not peft_targets(ac["target_modules"], path):
                continue
            # PEFT saves without the adapter name: base_model.model.<path>.lora_X.weight
            an = "base_model.model.%s.lora_A.weight" % path
            bn = "base_model.model.%s.lora_B.weight" % path
            if an not in tensors or bn not in tensors:
                raise SystemExit("torch_check.py: adapter lacks %s / %s" % (an, bn))
            a, b = tensors[an], tensors[bn]
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != r or b.shape[1] != r:
                raise SystemExit("torch_check.py: %s / %s: shapes %s %s, r %d" % (an, bn, list(a.shape), list(b.shape), r))
            lora[(l, mod)] = (an, bn)
            used.update((an, bn))
    extra = sorted(set(tensors) - used)
    if extra:
        raise SystemExit("torch_check.py: adapter tensors matching no target module: %s" % extra)
    params = {n: tensors[n].clone().requires_grad_(True) for n in sorted(used)}
    return lora, params, scale


def rms_norm(x, w, eps):
    # Qwen3RMSNorm: x * rsqrt(mean(x^2) + eps), then weight * x.
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def repeat_kv(x, n_rep):
    # [kv_heads, T, D] -> [kv_heads * n_rep, T, D]; head i reads kv head i // n_rep.
    kvh, T, D = x.shape
    if n_rep == 1:
        return x
    return x[:, None, :, :].expand(kvh, n_rep, T, D).reshape(kvh * n_rep, T, D)


class Model:
    def __init__(self, model_dir):
        self.cfg = load_config(model_dir)
        self.w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
        if self.cfg["tie_word_embeddings"]:
            self.lm_head = self.w["model.embed_tokens.weight"]
        else:
            self.lm_head = self.w["lm_head.weight"]
        self.lora, self.params, self.scale = {}, {}, 0.0

    def linear(self, x, l, mod):
        y = x @ self.w["model.layers.%d.%s.weight" % (l, mod)].t()
        names = self.lora.get((l, mod))
        if names is not None:
            a, b = self.params[names[0]], self.params[names[1]]
            y = y + ((x @ a.t()) @ b.t()) * self.scale
        return y

    def logprobs(self, ids):
        c = self.cfg
        T = len(ids)
        if T < 2:
            return torch.zeros(T, dtype=DT)
        nh, nkv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        eps = c["rms_norm_eps"]
        idx = torch.tensor(ids, dtype=torch.long)
        x = self.w["model.embed_tokens.weight"][idx]
        # Default RoPE: inv_freq = theta^(-2i/D), positions 0..T-1, cos/sin
        # of cat(freqs, freqs) over the whole head.
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=DT) / D))
        freqs = torch.outer(torch.arange(T, dtype=DT), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.triu(torch.full((T, T), float("-inf"), dtype=DT), diagonal=1)
        for l in range(c["num_hidden_layers"]):
            p = "model.layers.%d." % l
            residual = x
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], eps)
            q = self.linear(h, l, "self_attn.q_proj").view(T, nh, D)
            k = self.linear(h, l, "self_attn.k_proj").view(T, nkv, D)
            v = self.linear(h, l, "self_attn.v_proj").view(T, nkv, D)
            q = rms_norm(q, self.w[p + "self_attn.q_norm.weight"], eps).transpose(0, 1)
            k = rms_norm(k, self.w[p + "self_attn.k_norm.weight"], eps).transpose(0, 1)
            v = v.transpose(0, 1)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = repeat_kv(k, nh // nkv)
            v = repeat_kv(v, nh // nkv)
            att = torch.matmul(q, k.transpose(1, 2)) * (D ** -0.5) + mask
            att = torch.softmax(att, dim=-1)
            o = torch.matmul(att, v).transpose(0, 1).reshape(T, nh * D)
            x = residual + self.linear(o, l, "self_attn.o_proj")
            residual = x
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], eps)
            g = torch.nn.functional.silu(self.linear(h, l, "mlp.gate_proj"))
            u = self.linear(h, l, "mlp.up_proj")
            x = residual + self.linear(g * u, l, "mlp.down_proj")
        x = rms_norm(x, self.w["model.norm.weight"], eps)
        lp = torch.log_softmax(x[:-1] @ self.lm_head.t(), dim=-1)
        picked = lp.gather(1, idx[1:].unsqueeze(1)).squeeze(1)
        return torch.cat((torch.zeros(1, dtype=DT), picked))


def main():
    req = json.load(sys.stdin)
    m = Model(req["model_dir"])
    if req.get("adapter_dir"):
        m.lora, m.params, m.scale = load_adapter(req["adapter_dir"], m.cfg)
    weights = req.get("loss_weights")
    if weights is not None and len(weights) != len(req["seqs"]):
        raise SystemExit("torch_check.py: %d loss_weights rows for %d seqs" % (len(weights), len(req["seqs"])))
    out = {"logprobs": [], "grads": {}}
    total = torch.zeros((), dtype=DT)
    for i, ids in enumerate(req["seqs"]):
        lp = m.logprobs(ids)
        out["logprobs"].append(lp.detach().tolist())
        if weights is not None:
            if len(weights[i]) != len(ids):
                raise SystemExit("torch_check.py: seq %d: %d weights for %d tokens" % (i, len(weights[i]), len(ids)))
            total = total + (torch.tensor(weights[i], dtype=DT) * lp).sum()
    if weights is not None and m.params:
        names = sorted(m.params)
        if total.requires_grad:
            grads = torch.autograd.grad(total, [m.params[n] for n in names], allow_unused=True)
        else:  # no sequence long enough to have a log-prob
            grads = [None] * len(names)
        for n, g in zip(names, grads):
            if g is None:
                g = torch.zeros_like(m.params[n])
            out["grads"][n] = g.reshape(-1).tolist()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
