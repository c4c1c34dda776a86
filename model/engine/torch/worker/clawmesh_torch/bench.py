"""The torch worker on a GPU: correctness first, then speed against
transformers + peft doing the same LoRA step in the same run.

  python3 -m clawmesh_torch.bench --check --vectors DIR [--device cuda]
  python3 -m clawmesh_torch.bench --bench [--shapes 0.6b,1.7b,4b] [--device cuda]

(PYTHONPATH must hold the directory above clawmesh_torch; from the
repository: PYTHONPATH=model/engine/torch/worker.)

--check
  1. The shared test vectors (model/engine/native/testdata/vectors) on the
     device in float32 (TF32 off): log-probs without and with the adapter,
     the loss of one train step and the log-probs after it, against
     vectors.json, within its tolerance.
  2. Where transformers and peft are installed: the vectors adapter, and an
     adapter this worker exports after a train step, loaded with
     PeftModel.from_pretrained into transformers' Qwen3 on the same weights;
     its log-probs against this worker's (relative 1e-4 in float32). This is
     the check that PEFT loads what clawmesh exports.

--bench
  For each shape (Qwen3-0.6B, 1.7B, 4B-shaped random bf16 weights, as many
  as fit), the GRPO/OPD LoRA step (rank 16 on the seven projections, batch
  --seqs x --seq-len, the last three quarters of each sequence trained,
  advantages of both signs, the clipped surrogate, AdamW) on this worker
  and on transformers + peft (AutoModelForCausalLM in bf16 with sdpa
  attention, get_peft_model, the same loss written the usual way from the
  full logits, torch.optim.AdamW), alternately, in the same process:
  tokens/s, peak memory, and model FLOPs utilisation against the bf16
  matmul rate measured in the same run. Prints a table and, with --json, one
  JSON object per line.
"""

import argparse
import gc
import json
import math
import os
import sys
import tempfile
import time

import torch

from . import peft as cm_peft
from . import safetensors_io as st
from . import surrogate
from .engine import Dist, Engine
from .model import MODULES, hf_name

SHAPES = {
    # Qwen3 configurations as published (config.json), random weights.
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    # For trying the script on a CPU.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, vocab_size=512),
}


def _log(level, msg, **kw):
    if level != "debug":
        sys.stderr.write("%s %s %s\n" % (level, msg, " ".join("%s=%s" % kv for kv in kw.items())))


def _sync(dev):
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def _have_hf():
    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


# --- correctness -------------------------------------------------------------


def _engine(model_dir, device, dtype="float32", rank=8, name=None, grad_checkpoint=False):
    meta = {"model_dir": model_dir, "device": device, "dtype": dtype, "lora": {"rank": rank}, "seed": 1,
            "name": name or model_dir, "grad_checkpoint": grad_checkpoint}
    return Engine(meta, Dist(), _log)


def _batch_from_vectors(v):
    out = []
    for s in v["train_batch"]:
        n = len(s["Tokens"])
        mask = torch.tensor(s["LossMask"], dtype=torch.bool)
        mask[0] = False
        out.append({"tokens": s["Tokens"], "mask": mask, "adv": torch.tensor(s["Advantages"], dtype=torch.float64),
                    "old": torch.tensor(s["OldLogprobs"], dtype=torch.float64) if s.get("OldLogprobs") else None,
                    "ref": torch.tensor(s["RefLogprobs"], dtype=torch.float64) if s.get("RefLogprobs") else None})
        assert len(out[-1]["adv"]) == n
    return out


def _recipe(r):
    d = {"lr": r.get("LR") or 1e-4, "weight_decay": r.get("WeightDecay") or 0.0, "beta1": r.get("Beta1") or 0.9,
         "beta2": r.get("Beta2") or 0.999, "eps": r.get("Eps") or 1e-8, "max_grad_norm": r.get("MaxGradNorm") or 1.0,
         "micro_batch": r.get("MicroBatch") or 8}
    lc = r.get("Loss") or {}
    d["loss"] = {"eps_low": lc.get("EpsLow", 0), "eps_high": lc.get("EpsHigh", 0), "agg": lc.get("Agg", "token-mean"),
                 "ratio_bound": lc.get("RatioBound", 0), "kl_coef": lc.get("KLCoef", 0),
                 "entropy_coef": lc.get("EntropyCoef", 0)}
    return d


def _worst(a, b):
    w = 0.0
    for x, y in zip(a, b):
        for p, q in zip(x, y):
            w = max(w, abs(float(p) - float(q)) / max(1.0, abs(float(q))))
    return w


def _hf_load(model_dir, dtype, attn):
    """transformers' model for model_dir (newer releases name the dtype
    argument dtype, older ones torch_dtype)."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn)
    except TypeError:
        return AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation=attn)


def _hf_logprobs(model_dir, adapter_dir, seqs, device):
    """log-probs from transformers' Qwen3 with the adapter loaded by peft."""
    from peft import PeftModel

    m = _hf_load(model_dir, torch.float32, "eager").to(device)
    m = PeftModel.from_pretrained(m, adapter_dir).to(device)
    m.eval()
    out = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s], device=device)
            lp = torch.log_softmax(m(input_ids=ids).logits[0].float(), -1)
            picked = lp[:-1].gather(1, ids[0, 1:, None]).squeeze(1)
            out.append([0.0] + picked.cpu().tolist())
    del m
    return out


def check(args):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    vd = args.vectors
    with open(os.path.join(vd, "vectors.json")) as f:
        v = json.load(f)
    model, adapter = os.path.join(vd, "model"), os.path.join(vd, "adapter")
    tol = v["tolerance"]
    eng = _engine(model, args.device)
    eng.load(adapter)
    results = {"device": str(eng.device), "torch": torch.__version__}
    if eng.device.type == "cuda":
        results["gpu"] = torch.cuda.get_device_name(eng.device)
    ok = True
    for key, base in (("base_logprobs", True), ("adapter_logprobs", False)):
        got = eng.logprobs(v["seqs"], base)
        w = _worst(got, v[key])
        results["vectors " + key] = w
        ok &= w <= tol
    stats = eng.train(_batch_from_vectors(v), _recipe(v["train_recipe"]))
    results["vectors step_loss"] = abs(stats["loss"] - v["step_loss"])
    ok &= results["vectors step_loss"] <= tol
    w = _worst(eng.logprobs(v["seqs"], False), v["after_step_logprobs"])
    results["vectors after_step_logprobs"] = w
    ok &= w <= tol
    if _have_hf():
        import peft
        import transformers

        results["transformers"], results["peft"] = transformers.__version__, peft.__version__
        fresh = _engine(model, args.device)
        fresh.load(adapter)
        mine = fresh.logprobs(v["seqs"], False)
        w = _worst(_hf_logprobs(model, adapter, v["seqs"], str(fresh.device)), mine)
        results["peft vectors adapter"] = w
        ok &= w <= 1e-4
        with tempfile.TemporaryDirectory() as d:
            eng.export(d, model)  # the adapter after a train step, as clawmesh exports it
            w = _worst(_hf_logprobs(model, d, v["seqs"], str(eng.device)), eng.logprobs(v["seqs"], False))
        results["peft exported adapter"] = w
        ok &= w <= 1e-4
    else:
        results["peft"] = "not installed: the PEFT load check did not run"
    results["ok"] = bool(ok)
    print(json.dumps(results, indent=1))
    return 0 if ok else 1


# --- benchmark -----------------------------------------------------------------


def write_random_model(d, shape, vocab, seed=0):
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000, "max_position_embeddings": 40960, "hidden_act": "silu", "attention_bias": False,
           "torch_dtype": "bfloat16", "eos_token_id": vocab - 1, "bos_token_id": vocab - 2, "use_sliding_window": False}
    cfg.update(shape)
    cfg["vocab_size"] = shape.get("vocab_size", vocab)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    g = torch.Generator().manual_seed(seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    dims = {"q_proj": (q, H), "k_proj": (kv, H), "v_proj": (kv, H), "o_proj": (H, q),
            "gate_proj": (cfg["intermediate_size"], H), "up_proj": (cfg["intermediate_size"], H),
            "down_proj": (H, cfg["intermediate_size"])}

    def rnd(*s):
        return (torch.randn(*s, generator=g) / math.sqrt(s[-1])).to(torch.bfloat16)

    ts = {"model.embed_tokens.weight": (torch.randn(V, H, generator=g) * 0.02).to(torch.bfloat16),
          "model.norm.weight": torch.ones(H, dtype=torch.bfloat16)}
    if not cfg["tie_word_embeddings"]:
        ts["lm_head.weight"] = rnd(V, H)
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        ts[p + "input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        ts[p + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        ts[p + "self_attn.q_norm.weight"] = torch.ones(cfg["head_dim"], dtype=torch.bfloat16)
        ts[p + "self_attn.k_norm.weight"] = torch.ones(cfg["head_dim"], dtype=torch.bfloat16)
        for m in MODULES:
            ts[p + hf_name(m) + ".weight"] = rnd(*dims[m])
    st.write(os.path.join(d, "model.safetensors"), ts, {"format": "pt"})
    return cfg


def step_flops(cfg, B, T):
    """Model FLOPs of one LoRA train step: forward plus backward to the
    activations (2 + 2 per weight per token; frozen weights need no weight
    gradient), attention products, the LM head on trained tokens (as
    clawmesh bench engine counts them)."""
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    per_tok = H * (q + 2 * kv) + q * H + 3 * H * cfg["intermediate_size"]
    attn = 2 * (T * (T + 1) // 2) * q
    trained = T - T // 4
    fwd = B * (2 * per_tok * T * L + 2 * attn * L + 2 * cfg["vocab_size"] * H * trained)
    return 2 * fwd


def _bench_batch(cfg, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, T // 4 :] = True
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(B)], dtype=torch.float64)
    return toks, mask, adv


def bench_ours(model_dir, cfg, B, T, steps, device, rank, grad_checkpoint):
    eng = _engine(model_dir, device, dtype="bfloat16" if device.startswith("cuda") else "float32", rank=rank,
                  grad_checkpoint=grad_checkpoint)
    toks, mask, adv = _bench_batch(cfg, B, T, 1)
    batch = [{"tokens": toks[i].tolist(), "mask": mask[i].clone(), "adv": torch.full((T,), float(adv[i]), dtype=torch.float64),
              "old": None, "ref": None} for i in range(B)]
    rc = {"lr": 1e-5, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "max_grad_norm": 1.0, "micro_batch": B, "loss": {}}
    eng.train(batch, rc)  # warm-up
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.train(batch, rc)
    _sync(device)
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else 0
    del eng
    return dt / steps, peak


def bench_hf(model_dir, cfg, B, T, steps, device, rank, grad_checkpoint):
    from peft import LoraConfig, get_peft_model

    dt_ = torch.bfloat16 if device.startswith("cuda") else torch.float32
    m = _hf_load(model_dir, dt_, "sdpa").to(device)
    if grad_checkpoint:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.enable_input_require_grads()
    m = get_peft_model(m, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=MODULES, lora_dropout=0.0, task_type="CAUSAL_LM"))
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
    toks, mask, adv = _bench_batch(cfg, B, T, 1)
    ids, mask = toks.to(device), mask.to(device)
    advt = adv.float().to(device)[:, None].expand(B, T - 1)
    cfg_l = surrogate.Config()

    def step():
        logits = m(input_ids=ids).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        old = lp.detach()
        ratio = torch.exp(lp - old)
        unc = ratio * advt
        cl = torch.clamp(ratio, 1 - cfg_l.eps_low, 1 + cfg_l.eps_high) * advt
        per = -torch.minimum(unc, cl)
        msk = mask[:, 1:].float()
        loss = (per * msk).sum() / msk.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else 0
    del m, opt, params
    return dt / steps, peak


def matmul_rate(device, dtype, n=8192):
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = 0.0
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        reps = 10 if device.startswith("cuda") else 1
        for _ in range(reps):
            a @ b
        _sync(device)
        best = max(best, 2.0 * n ** 3 * reps / (time.perf_counter() - t0))
    return best


def bench(args):
    dev = args.device
    gpu = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu"
    dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    peak_rate = matmul_rate(dev, dtype, 8192 if dev.startswith("cuda") else 512)
    hf = _have_hf()
    rows = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        with tempfile.TemporaryDirectory() as d:
            cfg = write_random_model(d, shape, shape.get("vocab_size", 151936))
            fl = step_flops(cfg, args.seqs, args.seq_len)
            row = {"gpu": gpu, "shape": name, "seqs": args.seqs, "seq_len": args.seq_len, "lora_rank": args.rank,
                   "grad_checkpoint": args.grad_checkpoint, "matmul_tflops": peak_rate / 1e12, "torch": torch.__version__}
            # Alternate the two, rounds times, and keep each one's best.
            for _ in range(args.rounds):
                for who, fn in (("clawmesh", bench_ours), ("hf_peft", bench_hf if hf else None)):
                    if fn is None:
                        continue
                    try:
                        s, peak = fn(d, cfg, args.seqs, args.seq_len, args.steps, dev, args.rank, args.grad_checkpoint)
                    except Exception as e:  # out of memory: this shape does not fit
                        row[who + "_error"] = str(e)[:200]
                        gc.collect()
                        if dev.startswith("cuda"):
                            torch.cuda.empty_cache()
                        continue
                    tps = args.seqs * args.seq_len / s
                    if tps > row.get(who + "_tokens_per_s", 0):
                        row[who + "_tokens_per_s"] = tps
                        row[who + "_peak_gib"] = peak / (1 << 30)
                        row[who + "_mfu"] = fl / s / peak_rate
                    gc.collect()
                    if dev.startswith("cuda"):
                        torch.cuda.empty_cache()
            if hf and "clawmesh_tokens_per_s" in row and "hf_peft_tokens_per_s" in row:
                row["ratio"] = row["clawmesh_tokens_per_s"] / row["hf_peft_tokens_per_s"]
            if not hf:
                row["hf_peft"] = "transformers/peft not installed: no comparison"
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    if not args.json:
        print("GRPO LoRA step, %d x %d tokens, rank %d, on %s (%s matmul %.2f TFLOP/s measured in this run)"
              % (args.seqs, args.seq_len, args.rank, gpu, str(dtype).replace("torch.", ""), peak_rate / 1e12))
        for r in rows:
            def cell(who):
                if who + "_tokens_per_s" not in r:
                    return "%-34s" % r.get(who + "_error", "-")[:34]
                return "%9.0f tok/s %5.1f GiB MFU %4.1f%%" % (r[who + "_tokens_per_s"], r[who + "_peak_gib"], 100 * r[who + "_mfu"])
            print("  %-5s clawmesh %s | transformers+peft %s | ratio %s" % (
                r["shape"], cell("clawmesh"), cell("hf_peft"), "%.2fx" % r["ratio"] if "ratio" in r else "-"))
    return 0


def main():
    ap = argparse.ArgumentParser(prog="python3 -m clawmesh_torch.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="correctness on the device (shared vectors; peft load)")
    ap.add_argument("--bench", action="store_true", help="the LoRA step against transformers + peft")
    ap.add_argument("--vectors", default="model/engine/native/testdata/vectors", help="the shared test vectors")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="0.6b,1.7b,4b", help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per measure")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two stacks")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--grad-checkpoint", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not (a.check or a.bench):
        ap.error("--check, --bench or both")
    rc = 0
    if a.check:
        rc |= check(a)
    if a.bench:
        rc |= bench(a)
    return rc


if __name__ == "__main__":
    sys.exit(main())
