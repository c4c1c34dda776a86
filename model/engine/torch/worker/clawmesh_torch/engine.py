"""The worker's operations on one model and one adapter: log-probs, the
gradient and the AdamW step of the clipped surrogate, sampling, adapters and
checkpoints. Under torchrun every rank holds the model and the adapter and
takes its share of each batch (sample i goes to rank i mod world size): the
log-probs the loss needs are gathered, every rank computes the same loss
coefficients, gradients are summed with all_reduce, and every rank takes the
same step. The Go side talks to rank 0 and sees one engine."""

import math
import os
import time

import torch

from . import peft, surrogate
from . import safetensors_io as st
from .model import MODULES, Model
from .optim import AdamW


class BadInput(ValueError):
    pass


def is_oom(e):
    """Whether e is the device's allocator failing: CUDA's OutOfMemoryError
    (a RuntimeError saying "out of memory" before torch 1.13) or the CPU
    allocator's "can't allocate memory"."""
    cls = getattr(torch.cuda, "OutOfMemoryError", None)
    if cls is not None and isinstance(e, cls):
        return True
    msg = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


class RankError(RuntimeError):
    """Another rank failed; code and message are its."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Dist:
    """torch.distributed when launched by torchrun, else a world of one."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.on = self.world > 1
        self.dist = None
        if self.on:
            import torch.distributed as dist

            backend = "nccl" if torch.cuda.is_available() and os.environ.get("CLAWMESH_DIST_BACKEND") != "gloo" else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(self.local_rank)
            dist.init_process_group(backend=backend)
            self.backend = backend
            self.dist = dist

    def broadcast(self, obj):
        if not self.on:
            return obj
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj):
        """Every rank's obj, in rank order, on every rank."""
        if not self.on:
            return [obj]
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def all_reduce(self, t):
        if self.on:
            self.dist.all_reduce(t)
        return t

    def check(self, err):
        """Raises on every rank when any rank failed (err: None or an
        exception), so that no rank waits in a collective alone."""
        if not self.on:
            if err is not None:
                raise err
            return
        errs = self.gather(None if err is None else (error_code(err), str(err)))
        if err is not None:
            raise err
        for e in errs:
            if e is not None:
                raise RankError(*e)


def error_code(e):
    if is_oom(e):
        return "oom"
    if isinstance(e, RankError):
        return e.code
    if isinstance(e, BadInput):
        return "bad_input"
    if isinstance(e, peft.AdapterError):
        return "adapter"
    from .model import ConfigError, ModelError

    if isinstance(e, ConfigError):
        return "config"
    if isinstance(e, ModelError):
        return "model"
    return "internal"


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Engine:
    def __init__(self, meta, dist, log):
        self.dist, self.log = dist, log
        dev = meta.get("device") or "cpu"
        if dev == "cuda":
            if not torch.cuda.is_available():
                raise BadInput("device cuda: torch %s sees no CUDA device" % torch.__version__)
            dev = "cuda:%d" % dist.local_rank
        elif dev != "cpu":
            raise BadInput("device %r (cpu or cuda)" % dev)
        if meta.get("threads"):
            torch.set_num_threads(int(meta["threads"]))
        dt = meta.get("dtype") or ""
        if dt and dt not in _DTYPES:
            raise BadInput("dtype %r (float32, bfloat16 or float16)" % dt)
        self.model = Model(meta["model_dir"], dev, _DTYPES.get(dt), grad_checkpoint=bool(meta.get("grad_checkpoint")))
        self.device = self.model.device
        lc = meta.get("lora") or {}
        self.rank = int(lc.get("rank") or 8)
        self.alpha = float(lc.get("alpha") or 2 * self.rank)
        self.targets = lc.get("targets") or MODULES
        self.name = meta.get("name") or meta["model_dir"]
        self.oom_tokens = int(meta.get("simulate_oom_tokens") or 0)
        self._set(peft.fresh(self.model.cfg, self.rank, self.alpha, self.targets, self.device, meta.get("seed", 0)))

    def _set(self, lora):
        self.lora = lora
        self.opt = AdamW(lora.params())

    def info(self):
        c = self.model.cfg
        return {
            "name": self.name, "arch": c.model_type, "vocab_size": c.vocab, "layers": c.layers, "hidden": c.hidden,
            "heads": c.heads, "kv_heads": c.kv_heads, "head_dim": c.head_dim, "intermediate": c.inter,
            "max_position": c.max_pos, "tied_embeddings": c.tied, "eos": c.eos, "params": c.params(),
            "lora_params": self.lora.count(), "lora_rank": self.lora.rank, "lora_alpha": self.lora.alpha,
            "device": str(self.device), "dtype": str(self.model.dtype).replace("torch.", ""),
            "torch": torch.__version__, "world_size": self.dist.world,
        }

    # --- inputs ----------------------------------------------------------

    def _check_seq(self, toks, what):
        c = self.model.cfg
        if len(toks) > c.max_pos:
            raise BadInput("%s: %d tokens beyond max position %d" % (what, len(toks), c.max_pos))
        for i, t in enumerate(toks):
            if t < 0 or t >= c.vocab:
                raise BadInput("%s: token %d at %d outside vocabulary of %d" % (what, t, i, c.vocab))

    def _mine(self, n):
        return [i for i in range(n) if i % self.dist.world == self.dist.rank]

    def _oom_check(self, seqs):
        """The test hook simulate_oom_tokens (tests of the out-of-memory path
        on machines without a GPU): a micro-batch of more padded tokens asks
        the device's allocator for more than any device has (2^60 bytes), so
        that the allocator's own error, CUDA's or the CPU's, takes the path a
        real one takes."""
        if self.oom_tokens and len(seqs) * max(len(s) for s in seqs) > self.oom_tokens:
            self.log("warn", "simulated out of memory", sequences=len(seqs), longest=max(len(s) for s in seqs),
                     limit=self.oom_tokens)
            torch.empty(1 << 60, dtype=torch.uint8, device=self.device)

    # --- log-probs -------------------------------------------------------

    @torch.no_grad()
    def _logprobs_local(self, seqs, lora, need=None, want_ent=False, group=8):
        """log-probs (and entropies) of seqs, group sequences at a time
        (sorted by length); on out-of-memory, smaller groups."""
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        out = [None] * len(seqs)
        i = 0
        while i < len(order):
            idx = order[i : i + group]
            sub = [seqs[j] for j in idx]
            try:
                self._oom_check(sub)
                lp, ent = self.model.batch_logprobs(sub, lora, None if need is None else [need[j] for j in idx], want_ent)
            except Exception as e:
                if is_oom(e) and group > 1:
                    self._free()
                    group = max(1, group // 2)
                    continue
                raise
            lp, ent = lp.cpu(), ent.cpu()
            for k, j in enumerate(idx):
                n = len(seqs[j])
                out[j] = (lp[k, :n].clone(), ent[k, :n].clone())
            i += len(idx)
        return out

    def logprobs(self, seqs, base):
        for i, s in enumerate(seqs):
            self._check_seq(s, "sequence %d" % i)
        mine = self._mine(len(seqs))
        res, err = None, None
        try:
            res = self._logprobs_local([seqs[i] for i in mine], None if base else self.lora)
        except Exception as e:  # reported on every rank by check
            err = e
        self.dist.check(err)
        out = [None] * len(seqs)
        for part in self.dist.gather([(i, lp.tolist()) for i, (lp, _) in zip(mine, res)]):
            for i, lp in part:
                out[i] = lp
        return out

    # --- training --------------------------------------------------------

    def _batch(self, frame_meta, tensors):
        """Decodes a TRAIN/GRAD request into samples."""
        try:
            lengths, tokens, mask, adv, old, has_old, ref, has_ref = tensors
        except ValueError:
            raise BadInput("train request with %d tensors" % len(tensors))
        lengths = lengths.tolist()
        if sum(lengths) != tokens.numel() or any(x.numel() != tokens.numel() for x in (mask, adv, old, ref)) \
                or has_old.numel() != len(lengths) or has_ref.numel() != len(lengths):
            raise BadInput("train request tensors of inconsistent sizes")
        if not lengths:
            raise BadInput("empty batch")
        out, off = [], 0
        for i, n in enumerate(lengths):
            sl = slice(off, off + n)
            off += n
            s = {
                "tokens": tokens[sl].tolist(),
                "mask": mask[sl].bool().clone(),
                "adv": adv[sl].double(),
                "old": old[sl].double() if has_old[i] else None,
                "ref": ref[sl].double() if has_ref[i] else None,
            }
            if n < 2:
                raise BadInput("sample %d: %d tokens, need at least 2" % (i, n))
            self._check_seq(s["tokens"], "sample %d" % i)
            s["mask"][0] = False  # position 0 has no context
            out.append(s)
        return out

    def _gradient(self, batch, rc):
        """The summed, unclipped gradient (a list aligned with the adapter's
        params) of the surrogate over batch, and the step's statistics."""
        cfg = surrogate.Config.from_meta(rc.get("loss") or {})
        mb = int(rc.get("micro_batch") or 8)
        want_ent = cfg.entropy_coef != 0
        mine = self._mine(len(batch))
        local = [batch[i] for i in mine]
        one_pass = len(local) <= mb
        params = self.lora.params()
        for p in params:
            p.grad = None
        kept = {}
        err = None
        firsts = []
        try:
            if one_pass and local:
                self._oom_check([s["tokens"] for s in local])
                with torch.enable_grad():
                    lp, ent = self.model.batch_logprobs([s["tokens"] for s in local], self.lora,
                                                        [s["mask"].tolist() for s in local], want_ent)
                for k, i in enumerate(mine):
                    n = len(batch[i]["tokens"])
                    kept[i] = (lp, ent, k)
                    firsts.append((i, lp[k, :n].detach().double().cpu().tolist(),
                                   ent[k, :n].detach().double().cpu().tolist() if want_ent else None))
            else:
                for lo in range(0, len(local), mb):
                    part = local[lo : lo + mb]
                    self._oom_check([s["tokens"] for s in part])
                    lp, ent = self.model.batch_logprobs([s["tokens"] for s in part], self.lora,
                                                        [s["mask"].tolist() for s in part], want_ent)
                    for k, s in enumerate(part):
                        n = len(s["tokens"])
                        firsts.append((mine[lo + k], lp[k, :n].double().cpu().tolist(),
                                       ent[k, :n].double().cpu().tolist() if want_ent else None))
        except Exception as e:
            err = e
        self.dist.check(err)
        got = {}
        for part in self.dist.gather(firsts):
            for i, lp, ent in part:
                got[i] = (lp, ent)
        seqs = []
        for i, s in enumerate(batch):
            lp = torch.tensor(got[i][0], dtype=torch.float64)
            seqs.append({"new": lp, "old": s["old"] if s["old"] is not None else lp.clone(), "adv": s["adv"],
                         "mask": s["mask"], "ref": s["ref"],
                         "ent": torch.tensor(got[i][1], dtype=torch.float64) if want_ent else None})
        res = surrogate.surrogate(seqs, cfg)
        err = None
        try:
            if one_pass and local:
                lp, ent, _ = kept[mine[0]]
                dn = torch.zeros(lp.shape, dtype=torch.float64)
                de = torch.zeros(lp.shape, dtype=torch.float64)
                for k, i in enumerate(mine):
                    n = len(batch[i]["tokens"])
                    dn[k, :n] = res.dnew[i]
                    if want_ent:
                        de[k, :n] = res.dent[i]
                obj = (lp.double() * dn.to(lp.device)).sum()
                if want_ent:
                    obj = obj + (ent.double() * de.to(ent.device)).sum()
                if bool(dn.any()) or bool(de.any()):
                    obj.backward()
            else:
                live = [i for i in mine if bool(res.dnew[i].any()) or (res.dent[i] is not None and bool(res.dent[i].any()))]
                for lo in range(0, len(live), mb):
                    idx = live[lo : lo + mb]
                    toks = [batch[i]["tokens"] for i in idx]
                    self._oom_check(toks)
                    with torch.enable_grad():
                        lp, ent = self.model.batch_logprobs(toks, self.lora, [batch[i]["mask"].tolist() for i in idx], want_ent)
                        dn = torch.zeros(lp.shape, dtype=torch.float64)
                        de = torch.zeros(lp.shape, dtype=torch.float64)
                        for k, i in enumerate(idx):
                            n = len(toks[k])
                            dn[k, :n] = res.dnew[i]
                            if want_ent:
                                de[k, :n] = res.dent[i]
                        obj = (lp.double() * dn.to(lp.device)).sum()
                        if want_ent:
                            obj = obj + (ent.double() * de.to(ent.device)).sum()
                        obj.backward()
                    del lp, ent, obj
        except Exception as e:
            err = e
        kept.clear()
        if err is not None:
            for p in params:
                p.grad = None
            self._free()
        self.dist.check(err)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        for p in params:
            p.grad = None
        if self.dist.on:
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.dist.all_reduce(flat)
            out, off = [], 0
            for g in grads:
                out.append(flat[off : off + g.numel()].view_as(g))
                off += g.numel()
            grads = out
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
        stats = {"loss": res.loss, "grad_norm": norm, "clip_frac": res.clip_frac, "kl": res.kl,
                 "entropy": res.entropy, "tokens": res.tokens}
        if not math.isfinite(norm):
            raise BadInput("gradient norm %r" % norm)
        return grads, stats

    def gradient(self, batch, rc):
        return self._gradient(batch, rc)

    def train(self, batch, rc):
        grads, stats = self._gradient(batch, rc)
        mx = float(rc.get("max_grad_norm", 1.0))
        if mx > 0 and stats["grad_norm"] > mx:
            s = torch.tensor(mx / stats["grad_norm"], dtype=torch.float32)
            grads = [g * s.to(g.device) for g in grads]
        self.opt.step(grads, float(rc["lr"]), float(rc["beta1"]), float(rc["beta2"]), float(rc["eps"]),
                      float(rc.get("weight_decay", 0.0)))
        return stats

    def _free(self):
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- generation ------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompt, o, on_token):
        """Samples up to max_tokens after prompt; on_token(id, logprob,
        top_ids, top_lps) returns False to stop."""
        c = self.model.cfg
        self._check_seq(prompt, "prompt")
        if not prompt:
            raise BadInput("empty prompt")
        n = min(int(o.get("max_tokens") or 256), c.max_pos - len(prompt))
        if n <= 0:
            raise BadInput("prompt of %d fills the context" % len(prompt))
        temp, top_p, k = float(o.get("temperature", 0)), float(o.get("top_p", 0)), int(o.get("top_logprobs", 0))
        stop = set(c.eos) | set(o.get("stop") or [])
        g = torch.Generator().manual_seed(int(o.get("seed", 0)) & ((1 << 63) - 1))
        cache = self.model.new_cache(len(prompt) + n)
        toks, lps = [], []
        nxt, pos = list(prompt), 0
        while len(toks) < n:
            z = self.model.step(nxt, cache, pos, self.lora).double().cpu()
            pos += len(nxt)
            lsm = z - torch.logsumexp(z, 0)
            tid, tlp = [], []
            if k > 0:
                # ties: the lower id first, as the native engine
                order = sorted(range(z.shape[0]), key=lambda j: (-float(z[j]), j))[:k] if z.shape[0] <= 4096 else \
                    _topk_ties(z, k)
                tid, tlp = order, [float(lsm[j]) for j in order]
            if temp == 0:
                pick = int(torch.argmax(z))
            else:
                p = torch.exp((z - z.max()) / temp)
                idx = torch.arange(z.shape[0])
                if 0 < top_p < 1:
                    srt, order = torch.sort(p, descending=True, stable=True)
                    cum = torch.cumsum(srt / p.sum(), 0)
                    keep = int((cum < top_p).sum()) + 1
                    idx, p = order[:keep], srt[:keep]
                u = float(torch.rand((), generator=g, dtype=torch.float64)) * float(p.sum())
                cs = torch.cumsum(p, 0)
                j = int((cs <= u).sum())
                pick = int(idx[min(j, idx.shape[0] - 1)])
            lp = float(lsm[pick])
            toks.append(pick)
            lps.append(lp)
            if not on_token(pick, lp, tid, tlp):
                break
            if pick in stop:
                break
            nxt = [pick]
        return toks, lps

    # --- the device ------------------------------------------------------

    def device_stats(self, matmul=0, reset_peak=False):
        """The device's name, peak memory allocated so far (CUDA), and with
        matmul > 0 the rate of an n×n×n matrix product in the model dtype,
        the best of a few (a benchmark's reference)."""
        out = {"device": str(self.device), "dtype": str(self.model.dtype).replace("torch.", "")}
        cuda = self.device.type == "cuda"
        if cuda:
            out["name"] = torch.cuda.get_device_name(self.device)
            out["peak_memory"] = int(torch.cuda.max_memory_allocated(self.device))
            out["total_memory"] = int(torch.cuda.get_device_properties(self.device).total_memory)
            if reset_peak:
                torch.cuda.reset_peak_memory_stats(self.device)
        if matmul > 0:
            n = matmul
            a = torch.randn(n, n, device=self.device).to(self.model.dtype)
            b = torch.randn(n, n, device=self.device).to(self.model.dtype)
            best = 0.0
            for _ in range(5):
                if cuda:
                    torch.cuda.synchronize(self.device)
                t0 = time.perf_counter()
                reps = 10 if cuda else 1
                for _ in range(reps):
                    c = a @ b
                if cuda:
                    torch.cuda.synchronize(self.device)
                dt = time.perf_counter() - t0
                best = max(best, 2.0 * n * n * n * reps / dt)
            del a, b, c
            out["matmul_flops"] = best
        return out

    # --- adapters and checkpoints ----------------------------------------

    def load(self, d):
        lora = peft.load(d, self.model.cfg, self.device)
        self._set(lora)

    def export(self, d, name):
        if self.dist.rank == 0:
            peft.export(self.lora, d, name or self.name)

    def reset(self, seed):
        self._set(peft.fresh(self.model.cfg, self.rank, self.alpha, self.targets, self.device, seed))

    def checkpoint(self, d):
        """The adapter (PEFT) and the optimizer state (optimizer.safetensors)."""
        if self.dist.rank != 0:
            return
        peft.export(self.lora, d, self.name)
        m, v, t = self.opt.state()
        ts = {}
        for (name, _), mi, vi in zip(self.lora.named(), m, v):
            ts["m." + name] = mi
            ts["v." + name] = vi
        st.write(os.path.join(d, "optimizer.safetensors"), ts, {"step": str(t)})

    def restore(self, d):
        lora = peft.load(d, self.model.cfg, self.device)
        self._set(lora)
        f = st.File(os.path.join(d, "optimizer.safetensors"))
        try:
            names = [n for n, _ in lora.named()]
            m = [f.get("m." + n, dtype=torch.float32, device=self.device) for n in names]
            v = [f.get("v." + n, dtype=torch.float32, device=self.device) for n in names]
            self.opt.load(m, v, int(f.metadata.get("step", "0")))
        finally:
            f.close()


def _topk_ties(z, k):
    vals, idx = torch.topk(z, min(k + 16, z.shape[0]))
    cand = sorted(zip((-float(v) for v in vals), (int(i) for i in idx)))
    return [j for _, j in cand[:k]]
