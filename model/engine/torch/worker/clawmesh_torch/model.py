"""A Qwen3 decoder with LoRA in plain PyTorch, loaded from a Hugging Face
model directory (config.json + safetensors, one file or shards).

It follows transformers' modeling_qwen3: RMSNorm computed in float32,
grouped-query attention with per-head q/k RMSNorm before rotate-half RoPE,
SwiGLU MLP, tied or untied LM head; and PEFT's LoRA Linear, y = W x +
scale * B A x with scale = alpha / r (alpha / sqrt(r) with rsLoRA). Base
weights are frozen and stored in the model dtype (float32 on the CPU,
bfloat16 by default on CUDA, where the forward runs under bf16 autocast);
LoRA parameters are float32. Log-probs come from the LM head a chunk of rows
at a time, so a 150k vocabulary never materialises the whole batch's logits.
"""

import json
import math
import os

import torch
import torch.nn.functional as F
from torch.utils import checkpoint as _ckpt

from . import safetensors_io as st

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class ConfigError(ValueError):
    """config.json describes a model this worker does not run."""


class ModelError(ValueError):
    """The weights do not match config.json."""


def hf_name(mod):
    return ("self_attn." if mod in MODULES[:4] else "mlp.") + mod


class Config:
    """A Qwen3 architecture as config.json spells it, with transformers'
    Qwen3Config defaults for the keys it leaves out."""

    def __init__(self, raw):
        c = {
            "model_type": "qwen3",
            "num_key_value_heads": 32,
            "head_dim": 128,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "attention_bias": False,
            "use_sliding_window": False,
            "rope_scaling": None,
        }
        c.update(raw)
        rp = c.get("rope_parameters")
        if isinstance(rp, dict):
            if rp.get("rope_type", "default") != "default":
                raise ConfigError("unsupported feature (rope_parameters.rope_type %r)" % rp.get("rope_type"))
            if rp.get("rope_theta"):
                c["rope_theta"] = rp["rope_theta"]
        if c["attention_bias"] or c["use_sliding_window"] or c["rope_scaling"] or c["hidden_act"] != "silu":
            raise ConfigError("unsupported feature (attention bias, sliding window, rope scaling or activation %r)" % c["hidden_act"])
        try:
            self.model_type = c["model_type"] or "qwen3"
            self.vocab = int(c["vocab_size"])
            self.hidden = int(c["hidden_size"])
            self.inter = int(c["intermediate_size"])
            self.layers = int(c["num_hidden_layers"])
            self.heads = int(c["num_attention_heads"])
            self.kv_heads = int(c["num_key_value_heads"] or self.heads)
            self.head_dim = int(c["head_dim"] or (self.hidden // self.heads))
            self.eps = float(c["rms_norm_eps"] or 1e-6)
            self.theta = float(c["rope_theta"] or 1e6)
            self.tied = bool(c["tie_word_embeddings"])
            self.max_pos = int(c["max_position_embeddings"] or 32768)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError("config.json: %s" % e)
        eos = c.get("eos_token_id")
        self.eos = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(x) for x in eos])
        if min(self.vocab, self.hidden, self.inter, self.layers, self.heads, self.kv_heads, self.head_dim, self.max_pos) <= 0:
            raise ConfigError("non-positive dimension")
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise ConfigError("%d heads over %d kv heads, head_dim %d" % (self.heads, self.kv_heads, self.head_dim))
        if self.eps <= 0 or self.theta <= 1:
            raise ConfigError("rms_norm_eps %g, rope_theta %g" % (self.eps, self.theta))
        if any(e < 0 or e >= self.vocab for e in self.eos):
            raise ConfigError("eos id outside the vocabulary")

    def dims(self, mod):
        """(out, in) of a projection."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (q, self.hidden),
            "k_proj": (kv, self.hidden),
            "v_proj": (kv, self.hidden),
            "o_proj": (self.hidden, q),
            "gate_proj": (self.inter, self.hidden),
            "up_proj": (self.inter, self.hidden),
            "down_proj": (self.hidden, self.inter),
        }[mod]

    def params(self):
        n = 2 * self.vocab * self.hidden if not self.tied else self.vocab * self.hidden
        n += self.hidden
        per = 2 * self.hidden + 2 * self.head_dim
        for m in MODULES:
            o, i = self.dims(m)
            per += o * i
        return n + per * self.layers


def read_config(model_dir):
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError("%s: %s" % (path, e))
    if not isinstance(raw, dict):
        raise ConfigError("%s is not an object" % path)
    return Config(raw)


class LoRA:
    """A LoRA adapter: A [r, in] and B [out, r] per adapted projection, as
    float32 leaf tensors on the device, keyed by (layer, module)."""

    def __init__(self, cfg, rank, alpha, targets, device, rslora=False):
        self.rank, self.alpha, self.rslora = int(rank), float(alpha), bool(rslora)
        self.scale = self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)
        self.targets = [m for m in MODULES if m in targets]
        self.ab = {}
        for l in range(cfg.layers):
            for m in self.targets:
                out, inp = cfg.dims(m)
                a = torch.zeros(self.rank, inp, dtype=torch.float32, device=device, requires_grad=True)
                b = torch.zeros(out, self.rank, dtype=torch.float32, device=device, requires_grad=True)
                self.ab[(l, m)] = (a, b)

    def params(self):
        """Every parameter in a fixed order (layer, module, A then B)."""
        out = []
        for key in sorted(self.ab, key=lambda k: (k[0], MODULES.index(k[1]))):
            out.extend(self.ab[key])
        return out

    def named(self):
        """(PEFT tensor name, tensor) pairs in params() order."""
        out = []
        for (l, m) in sorted(self.ab, key=lambda k: (k[0], MODULES.index(k[1]))):
            a, b = self.ab[(l, m)]
            out.append((tensor_name(l, m, "A"), a))
            out.append((tensor_name(l, m, "B"), b))
        return out

    def count(self):
        return sum(p.numel() for p in self.params())


def tensor_name(layer, mod, ab):
    return "base_model.model.model.layers.%d.%s.lora_%s.weight" % (layer, hf_name(mod), ab)


def _rope_table(n, start, head_dim, theta, device):
    # As the native engine and transformers: float32 inverse frequencies and
    # angles; cos and sin taken in float64 and rounded.
    half = head_dim // 2
    inv = torch.tensor([1.0 / math.pow(theta, 2.0 * i / head_dim) for i in range(half)], dtype=torch.float64).float()
    pos = torch.arange(start, start + n, dtype=torch.float32)
    ang = (pos[:, None] * inv[None, :]).double()
    cos = torch.cat((ang.cos(), ang.cos()), -1).float()
    sin = torch.cat((ang.sin(), ang.sin()), -1).float()
    return cos.to(device), sin.to(device)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rms(x, w, eps):
    dt = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dt)


_HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class Model:
    """The frozen base model on a device."""

    def __init__(self, model_dir, device="cpu", dtype=None, grad_checkpoint=False, head_chunk_bytes=256 << 20):
        self.cfg = cfg = read_config(model_dir)
        self.device = torch.device(device)
        if dtype is None:
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.dtype = dtype
        self.autocast = self.device.type == "cuda" and dtype != torch.float32
        self.grad_checkpoint = grad_checkpoint
        self.head_chunk_bytes = head_chunk_bytes
        self._rope = {}
        files = {}
        index = os.path.join(model_dir, "model.safetensors.index.json")
        weight_map = None
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f).get("weight_map") or {}

        def get(name, shape):
            shard = weight_map.get(name) if weight_map is not None else "model.safetensors"
            if not shard or os.path.basename(shard) != shard:
                raise ModelError("no shard for %s" % name)
            f = files.get(shard)
            if f is None:
                try:
                    f = files[shard] = st.File(os.path.join(model_dir, shard))
                except (OSError, st.FormatError) as e:
                    raise ModelError(str(e))
            if name not in f.info:
                raise ModelError("%s lacks %s" % (shard, name))
            if f.shape(name) != list(shape):
                raise ModelError("%s has shape %s, config says %s" % (name, f.shape(name), list(shape)))
            return f.get(name, dtype=dtype, device=self.device)

        try:
            H = cfg.hidden
            self.embed = get("model.embed_tokens.weight", (cfg.vocab, H))
            self.norm = get("model.norm.weight", (H,))
            self.lm_head = self.embed if cfg.tied else get("lm_head.weight", (cfg.vocab, H))
            self.layers = []
            for l in range(cfg.layers):
                p = "model.layers.%d." % l
                lw = {
                    "in_norm": get(p + "input_layernorm.weight", (H,)),
                    "post_norm": get(p + "post_attention_layernorm.weight", (H,)),
                    "q_norm": get(p + "self_attn.q_norm.weight", (cfg.head_dim,)),
                    "k_norm": get(p + "self_attn.k_norm.weight", (cfg.head_dim,)),
                }
                for m in MODULES:
                    lw[m] = get(p + hf_name(m) + ".weight", cfg.dims(m))
                self.layers.append(lw)
        finally:
            for f in files.values():
                f.close()

    def rope(self, n, start=0):
        key = (n, start)
        t = self._rope.get(key)
        if t is None:
            if len(self._rope) > 64:
                self._rope.clear()
            t = self._rope[key] = _rope_table(n, start, self.cfg.head_dim, self.cfg.theta, self.device)
        return t

    def autocast_ctx(self):
        if self.autocast:
            return torch.autocast(device_type="cuda", dtype=self.dtype)
        return _Null()

    # --- the decoder ---------------------------------------------------

    def _linear(self, x, l, m, lora):
        y = F.linear(x, self.layers[l][m])
        if lora is not None:
            ab = lora.ab.get((l, m))
            if ab is not None:
                y = y + F.linear(F.linear(x, ab[0]), ab[1]) * lora.scale
        return y

    def _attend(self, q, k, v, causal):
        # q [B, H, Tq, D]; k, v [B, KV, Tk, D].
        c = self.cfg
        rep = c.heads // c.kv_heads
        if rep > 1:
            B, KV, Tk, D = k.shape
            k = k[:, :, None].expand(B, KV, rep, Tk, D).reshape(B, KV * rep, Tk, D)
            v = v[:, :, None].expand(B, KV, rep, Tk, D).reshape(B, KV * rep, Tk, D)
        if _HAS_SDPA and q.device.type == "cuda":
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        s = torch.matmul(q, k.transpose(-1, -2)) * (c.head_dim ** -0.5)
        if causal:
            Tq, Tk = q.shape[-2], k.shape[-2]
            mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(Tk - Tq + 1)
            s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        return torch.matmul(p, v)

    def _layer(self, l, x, lora, cos, sin, cache=None, start=0):
        c = self.cfg
        lw = self.layers[l]
        B, T, _ = x.shape
        h = _rms(x, lw["in_norm"], c.eps)
        q = self._linear(h, l, "q_proj", lora).view(B, T, c.heads, c.head_dim)
        k = self._linear(h, l, "k_proj", lora).view(B, T, c.kv_heads, c.head_dim)
        v = self._linear(h, l, "v_proj", lora).view(B, T, c.kv_heads, c.head_dim)
        q = _rms(q, lw["q_norm"], c.eps).transpose(1, 2)
        k = _rms(k, lw["k_norm"], c.eps).transpose(1, 2)
        v = v.transpose(1, 2)
        cq, sq = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cq + _rotate_half(q) * sq
        k = k * cq.to(k.dtype) + _rotate_half(k) * sq.to(k.dtype)
        if cache is not None:
            kc, vc = cache
            kc[:, :, start : start + T] = k.to(kc.dtype)
            vc[:, :, start : start + T] = v.to(vc.dtype)
            k, v = kc[:, :, : start + T], vc[:, :, : start + T]
            o = self._attend(q, k.to(q.dtype), v.to(q.dtype), causal=T > 1)
        else:
            o = self._attend(q, k, v, causal=True)
        o = o.transpose(1, 2).reshape(B, T, c.heads * c.head_dim)
        x = x + self._linear(o, l, "o_proj", lora)
        h = _rms(x, lw["post_norm"], c.eps)
        g = F.silu(self._linear(h, l, "gate_proj", lora))
        u = self._linear(h, l, "up_proj", lora)
        return x + self._linear(g * u, l, "down_proj", lora)

    def hidden(self, ids, lora):
        """Final normed hidden states [B, T, H] of right-padded ids [B, T]
        (causal attention: padding after a sequence never reaches it)."""
        T = ids.shape[1]
        cos, sin = self.rope(T)
        x = F.embedding(ids, self.embed)
        ckpt = self.grad_checkpoint and torch.is_grad_enabled()
        for l in range(self.cfg.layers):
            if ckpt:
                x = _ckpt.checkpoint(self._layer, l, x, lora, cos, sin, use_reentrant=False)
            else:
                x = self._layer(l, x, lora, cos, sin)
        return _rms(x, self.norm, self.cfg.eps)

    # --- log-probs -----------------------------------------------------

    def _head(self, rows, targets, want_ent):
        z = F.linear(rows, self.lm_head).float()
        lse = torch.logsumexp(z, dim=-1)
        lp = z.gather(1, targets[:, None]).squeeze(1) - lse
        if want_ent:
            ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
        else:
            ent = torch.zeros_like(lp)
        return lp, ent

    def head_logprobs(self, rows, targets, want_ent=False):
        """log p(target | row) and the entropy at each row [N, H], a chunk
        of rows at a time; under autograd each chunk's logits are
        recomputed in backward rather than kept."""
        n = rows.shape[0]
        chunk = max(1, self.head_chunk_bytes // (4 * self.cfg.vocab))
        if n <= chunk and not torch.is_grad_enabled():
            return self._head(rows, targets, want_ent)
        lps, ents = [], []
        for i in range(0, n, chunk):
            r, t = rows[i : i + chunk], targets[i : i + chunk]
            if torch.is_grad_enabled():
                lp, ent = _ckpt.checkpoint(self._head, r, t, want_ent, use_reentrant=False)
            else:
                lp, ent = self._head(r, t, want_ent)
            lps.append(lp)
            ents.append(ent)
        return torch.cat(lps), torch.cat(ents)

    def batch_logprobs(self, seqs, lora, need=None, want_ent=False):
        """For token lists seqs, [B, Tmax] float32 tensors of log p(tok[t] |
        tok[:t]) (0 at t = 0, at padding and where need[i][t] is false) and
        of the entropy there (zeros unless want_ent)."""
        B = len(seqs)
        Tm = max(len(s) for s in seqs)
        ids = torch.zeros(B, Tm, dtype=torch.long)
        bi, ti = [], []
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            for t in range(1, len(s)):
                if need is None or need[i][t]:
                    bi.append(i)
                    ti.append(t)
        ids = ids.to(self.device)
        lp = torch.zeros(B, Tm, dtype=torch.float32, device=self.device)
        ent = torch.zeros(B, Tm, dtype=torch.float32, device=self.device)
        if not bi:
            return lp, ent
        with self.autocast_ctx():
            h = self.hidden(ids, lora)
            b = torch.tensor(bi, dtype=torch.long, device=self.device)
            t = torch.tensor(ti, dtype=torch.long, device=self.device)
            rows = h[b, t - 1]
            lpr, entr = self.head_logprobs(rows, ids[b, t], want_ent)
        lp = lp.index_put((b, t), lpr.float())
        ent = ent.index_put((b, t), entr.float())
        return lp, ent

    # --- generation ------------------------------------------------------

    def new_cache(self, capacity):
        c = self.cfg
        dt = self.dtype
        return [
            (
                torch.zeros(1, c.kv_heads, capacity, c.head_dim, dtype=dt, device=self.device),
                torch.zeros(1, c.kv_heads, capacity, c.head_dim, dtype=dt, device=self.device),
            )
            for _ in range(c.layers)
        ]

    @torch.no_grad()
    def step(self, toks, cache, start, lora):
        """Runs toks at positions [start, start+len) through the model with
        the cache; returns the float32 logits of the last one."""
        n = len(toks)
        ids = torch.tensor([toks], dtype=torch.long, device=self.device)
        cos, sin = self.rope(n, start)
        with self.autocast_ctx():
            x = F.embedding(ids, self.embed)
            for l in range(self.cfg.layers):
                x = self._layer(l, x, lora, cos, sin, cache=cache[l], start=start)
            x = _rms(x[:, -1:], self.norm, self.cfg.eps)
            z = F.linear(x[0, 0], self.lm_head)
        return z.float()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
