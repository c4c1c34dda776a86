"""PEFT LoRA adapter directories (adapter_config.json +
adapter_model.safetensors): load, export, fresh initialisation.

adapter_config.json is read with the types PEFT's LoraConfig gives its
fields, and written so that PEFT can load it (rank_pattern and alpha_pattern
as {}, never null: PEFT keeps a null as None and calls .keys() on them)."""

import json
import math
import os
import re

import torch

from . import safetensors_io as st
from .model import MODULES, LoRA, hf_name, tensor_name

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class AdapterError(ValueError):
    pass


_S, _B, _D, _L, _N = (str,), (bool,), (dict,), (list,), (int, float)
# field: (JSON types, null allowed), as PEFT's PeftConfig and LoraConfig.
FIELDS = {
    "peft_type": (_S, False), "task_type": (_S, True), "base_model_name_or_path": (_S, True),
    "revision": (_S, True), "inference_mode": (_B, False), "auto_mapping": (_D, True),
    "peft_version": (_S, True), "r": ((int,), False), "lora_alpha": (_N, False),
    "lora_dropout": (_N, False), "target_modules": (_L + _S, True), "exclude_modules": (_L + _S, True),
    "fan_in_fan_out": (_B, False), "bias": (_S, False), "use_rslora": (_B, False),
    "modules_to_save": (_L, True), "init_lora_weights": (_B + _S, False),
    "layers_to_transform": (_L + (int,), True), "layers_pattern": (_L + _S, True),
    "rank_pattern": (_D, False), "alpha_pattern": (_D, False), "megatron_config": (_D, True),
    "megatron_core": (_S, True), "loftq_config": (_D, False), "use_dora": (_B, False),
    "layer_replication": (_L, True), "lora_bias": (_B, False), "use_qalora": (_B, False),
    "qalora_group_size": ((int,), False), "eva_config": (_D, True), "corda_config": (_D, True),
    "trainable_token_indices": (_L + _D, True),
}


def check_config(ac):
    if not isinstance(ac, dict):
        raise AdapterError("%s is not an object" % CONFIG_FILE)
    for k, v in ac.items():
        spec = FIELDS.get(k)
        if spec is None:
            continue  # newer PEFT fields default harmlessly; the refusals below cover what matters
        types, nullable = spec
        if v is None:
            if not nullable:
                raise AdapterError("%s: %s is null" % (CONFIG_FILE, k))
            continue
        if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
            raise AdapterError("%s: %s is %r" % (CONFIG_FILE, k, v))
    for k in ("peft_type", "r", "lora_alpha", "target_modules"):
        if ac.get(k) is None:
            raise AdapterError("%s lacks %s" % (CONFIG_FILE, k))
    if (
        ac["peft_type"] != "LORA"
        or ac.get("use_dora", False)
        or ac.get("bias", "none") != "none"
        or ac.get("fan_in_fan_out", False)
        or ac.get("modules_to_save")
        or ac.get("layers_to_transform") is not None
        or ac.get("rank_pattern", {})
        or ac.get("alpha_pattern", {})
        or ac.get("lora_bias", False)
    ):
        raise AdapterError("unsupported peft config %s" % json.dumps(ac, sort_keys=True))
    r, alpha = ac["r"], ac["lora_alpha"]
    if not (0 < r <= 4096) or not (alpha > 0) or math.isinf(alpha):
        raise AdapterError("lora rank %r alpha %r" % (r, alpha))


def _targets(tm, cfg):
    """Module names PEFT would adapt: a list matches a module path exactly
    or by dotted suffix; a string is a full-match regex."""
    out = []
    for m in MODULES:
        path = "model.layers.0." + hf_name(m)
        if isinstance(tm, str):
            ok = re.fullmatch(tm, path) is not None
        else:
            ok = any(path == t or path.endswith("." + t) for t in tm)
        if ok:
            out.append(m)
    return out


def load(adapter_dir, cfg, device):
    """Reads a PEFT LoRA directory for a model of config cfg into a LoRA."""
    try:
        with open(os.path.join(adapter_dir, CONFIG_FILE)) as f:
            ac = json.load(f)
    except (OSError, ValueError) as e:
        raise AdapterError(str(e))
    check_config(ac)
    targets = _targets(ac["target_modules"], cfg)
    if not targets:
        raise AdapterError("no target modules")
    lora = LoRA(cfg, ac["r"], ac["lora_alpha"], targets, device, rslora=ac.get("use_rslora", False))
    try:
        f = st.File(os.path.join(adapter_dir, WEIGHTS_FILE))
    except (OSError, st.FormatError) as e:
        raise AdapterError(str(e))
    try:
        want = 0
        with torch.no_grad():
            for name, p in lora.named():
                if name not in f.info:
                    raise AdapterError("adapter lacks %s" % name)
                if f.shape(name) != list(p.shape):
                    raise AdapterError("%s has shape %s, want %s" % (name, f.shape(name), list(p.shape)))
                t = f.get(name, dtype=torch.float32)
                if not torch.isfinite(t).all():
                    raise AdapterError("%s is not finite" % name)
                p.copy_(t.to(p.device))
                want += 1
        if len(f.info) != want:
            raise AdapterError("%d tensors, expected %d" % (len(f.info), want))
    finally:
        f.close()
    return lora


def export(lora, adapter_dir, base_model):
    """Writes lora as a PEFT directory (float32 tensors)."""
    os.makedirs(adapter_dir, exist_ok=True)
    ac = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": lora.rank,
        "lora_alpha": int(lora.alpha) if float(lora.alpha).is_integer() else lora.alpha,
        "lora_dropout": 0,
        "target_modules": list(lora.targets),
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": lora.rslora,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    check_config(ac)
    st.write(os.path.join(adapter_dir, WEIGHTS_FILE), {n: p for n, p in lora.named()}, {"format": "pt"})
    tmp = os.path.join(adapter_dir, CONFIG_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(ac, f, indent=2)
    os.replace(tmp, os.path.join(adapter_dir, CONFIG_FILE))


def fresh(cfg, rank, alpha, targets, device, seed):
    """A fresh adapter as PEFT initialises one: A uniform in ±1/sqrt(in)
    (kaiming_uniform with a = sqrt(5)), B zero, drawn from seed. The Go side
    usually loads the native engine's fresh adapter instead, so that both
    engines start alike; this serves the worker alone (the benchmark)."""
    lora = LoRA(cfg, rank, alpha, targets, device)
    g = torch.Generator().manual_seed(int(seed) & ((1 << 63) - 1))
    with torch.no_grad():
        for (l, m), (a, b) in sorted(lora.ab.items(), key=lambda kv: (kv[0][0], MODULES.index(kv[0][1]))):
            bound = 1 / math.sqrt(a.shape[1])
            a.copy_((torch.rand(a.shape, generator=g, dtype=torch.float32) * 2 - 1) * bound)
    return lora
