"""The clipped policy-gradient surrogate of model/loss, in float64 torch.

model/loss/doc.go is the written specification; this is its second
implementation, checked token for token against loss.Surrogate by the Go
tests (model/engine/torch, TestSurrogateMatchesGo). Per kept token, with
rho = exp(new - old):

  L = -min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A)
      + kl_coef*(exp(ref-new) - (ref-new) - 1) - entropy_coef*H

reduced by token-mean or seq-mean, with the exact gradient with respect to
every new log-prob (and every entropy). Tokens with a non-finite or absurd
input (beyond 1e100) are dropped; tokens whose ratio lies outside
[1/ratio_bound, ratio_bound] are masked.

Run as `python3 -m clawmesh_torch.surrogate` it reads cases as JSON on stdin
(non-finite numbers as the strings "nan", "inf", "-inf") and writes results.
"""

import json
import math
import sys

import torch

BIG = 1e100
DT = torch.float64


class Config:
    def __init__(self, eps_low=0.0, eps_high=0.0, agg="token-mean", ratio_bound=0.0, kl_coef=0.0, entropy_coef=0.0):
        # Defaults, then every invalid field replaced by its default (as
        # loss.Config.sanitize).
        self.eps_low = eps_low or 0.2
        self.eps_high = eps_high or 0.28
        self.ratio_bound = ratio_bound or 5.0
        self.kl_coef, self.entropy_coef = kl_coef, entropy_coef
        if not (0 < self.eps_low <= 1):
            self.eps_low = 0.2
        if not (0 < self.eps_high <= BIG):
            self.eps_high = 0.28
        if not (self.ratio_bound > 1):
            self.ratio_bound = 5.0
        if not (0 <= self.kl_coef <= BIG):
            self.kl_coef = 0.0
        if not (abs(self.entropy_coef) <= BIG):
            self.entropy_coef = 0.0
        self.agg = agg if agg in ("token-mean", "seq-mean") else "token-mean"

    @classmethod
    def from_meta(cls, m):
        rb = math.inf if m.get("ratio_bound_off") else m.get("ratio_bound", 0.0)
        return cls(m.get("eps_low", 0.0), m.get("eps_high", 0.0), m.get("agg", "token-mean"), rb,
                   m.get("kl_coef", 0.0), m.get("entropy_coef", 0.0))


class Result:
    pass


def _fin(x):
    return x.abs() <= BIG  # False for NaN and ±Inf


def _pad(x, n):
    if x.shape[0] >= n:
        return x[:n]
    return torch.cat((x, torch.full((n - x.shape[0],), math.nan, dtype=DT)))


def surrogate(seqs, cfg):
    """seqs: dicts with float64 tensors new, old, adv, bool tensor mask, and
    ref and ent (tensors or None). Returns a Result with loss, dnew and dent
    (lists of tensors like new and ent; dent[i] None where ent is None),
    clip_frac, masked_frac, kl, entropy, tokens, dropped."""
    lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
    log_bound = math.log(cfg.ratio_bound)
    klc, ec = cfg.kl_coef, cfg.entropy_coef
    res = Result()
    res.dnew, res.dent = [], []
    per = []  # (n, loss, kl, ent) sums per sequence
    selected = dropped = ratio_masked = clipped = 0
    for s in seqs:
        new = s["new"].to(DT)
        g = torch.zeros_like(new)
        res.dnew.append(g)
        ent_in = s.get("ent")
        dent = torch.zeros(ent_in.shape[0], dtype=DT) if ent_in is not None else None
        res.dent.append(dent)
        n = min(new.shape[0], s["old"].shape[0], s["adv"].shape[0], s["mask"].shape[0])
        new, old, adv = new[:n], s["old"][:n].to(DT), s["adv"][:n].to(DT)
        sel = s["mask"][:n].bool()
        selected += int(sel.sum())
        alive = sel & _fin(new) & _fin(old) & _fin(adv)
        drop = int((sel & ~alive).sum())
        ref_in = s.get("ref")
        zero = torch.zeros(n, dtype=DT)
        if ref_in is not None:
            ref = _pad(ref_in.to(DT), n)
            have_ref = _fin(ref)
            if klc != 0:
                drop += int((alive & ~have_ref).sum())
                alive = alive & have_ref
            d = torch.where(have_ref, ref - new, zero)
            kl = torch.expm1(d) - d
            dkl = 1 - torch.exp(d)
            bad = have_ref & ~(_fin(kl) & _fin(dkl))
            if klc != 0:
                drop += int((alive & bad).sum())
                alive = alive & ~bad
            have_ref = have_ref & ~bad
            kl = torch.where(have_ref, kl, zero)
            dkl = torch.where(have_ref, dkl, zero)
        else:
            have_ref = torch.zeros(n, dtype=torch.bool)
            kl, dkl = zero, zero
        if ent_in is not None:
            ev = _pad(ent_in.to(DT), n)
            have_ent = _fin(ev)
            if ec != 0:
                drop += int((alive & ~have_ent).sum())
                alive = alive & have_ent
            ent = torch.where(have_ent, ev, zero)
        else:
            have_ent = torch.zeros(n, dtype=torch.bool)
            ent = zero
        logr = torch.where(alive, new - old, zero)
        out = alive & ((logr > log_bound) | (logr < -log_bound))
        ratio_masked += int(out.sum())
        alive = alive & ~out
        r = torch.exp(logr)
        out = alive & ~_fin(r)
        ratio_masked += int(out.sum())
        alive = alive & ~out
        r = torch.where(alive, r, zero)
        advz = torch.where(alive, adv, zero)
        unc = r * advz
        cl = torch.clamp(r, lo, hi) * advz
        is_clipped = cl < unc
        l = torch.where(is_clipped, -cl, -unc)
        dl = torch.where(is_clipped, zero, -advz * r)
        l = l + torch.where(have_ref, klc * kl, zero)
        dl = dl + torch.where(have_ref, klc * dkl, zero)
        l = l - ec * ent
        out = alive & ~(_fin(l) & _fin(dl))
        drop += int(out.sum())
        alive = alive & ~out
        dropped += drop
        clipped += int((alive & is_clipped).sum())
        g[:n] = torch.where(alive, dl, zero)
        if dent is not None and ec != 0:
            dent[:n] = torch.where(alive & have_ent, torch.full((n,), -ec, dtype=DT), zero)
        keep = lambda v: float(torch.where(alive, v, zero).sum())
        per.append((int(alive.sum()), keep(l), keep(kl), keep(ent)))
    tokens = sum(p[0] for p in per)
    nseq = sum(1 for p in per if p[0] > 0)
    res.tokens, res.dropped = tokens, dropped
    fin_sel = selected - dropped
    res.masked_frac = ratio_masked / fin_sel if fin_sel > 0 else 0.0
    res.loss = res.kl = res.entropy = res.clip_frac = 0.0
    if tokens == 0:
        for g in res.dnew:
            g.zero_()
        for d in res.dent:
            if d is not None:
                d.zero_()
        return res
    res.clip_frac = clipped / tokens
    for i, (n, l, kl, ent) in enumerate(per):
        w = 0.0
        if n > 0:
            w = 1 / (nseq * n) if cfg.agg == "seq-mean" else 1 / tokens
        res.loss += w * l
        res.kl += w * kl
        res.entropy += w * ent
        res.dnew[i].mul_(w)
        if res.dent[i] is not None:
            res.dent[i].mul_(w)
    return res


def _num(x):
    if isinstance(x, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[x]
    return float(x)


def _vec(v):
    return None if v is None else torch.tensor([_num(x) for x in v], dtype=DT)


def main():
    cases = json.load(sys.stdin)
    out = []
    for c in cases:
        cfg = Config.from_meta(c["cfg"])
        seqs = [
            {"new": _vec(s["new"]), "old": _vec(s["old"]), "adv": _vec(s["adv"]),
             "mask": torch.tensor(s["mask"], dtype=torch.bool), "ref": _vec(s.get("ref")), "ent": _vec(s.get("ent"))}
            for s in c["seqs"]
        ]
        r = surrogate(seqs, cfg)
        out.append({
            "loss": r.loss, "kl": r.kl, "entropy": r.entropy, "clip_frac": r.clip_frac,
            "masked_frac": r.masked_frac, "tokens": r.tokens, "dropped": r.dropped,
            "dnew": [g.tolist() for g in r.dnew],
            "dent": [None if d is None else d.tolist() for d in r.dent],
        })
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
