"""AdamW as the native engine applies it (model/engine/native): moments
kept in float32, the update computed in float64, decoupled weight decay,
bias correction by step count."""

import math

import torch


class AdamW:
    def __init__(self, params):
        self.params = list(params)
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self, grads, lr, beta1, beta2, eps, wd):
        self.t += 1
        c1 = 1 - math.pow(beta1, self.t)
        c2 = 1 - math.pow(beta2, self.t)
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            g64 = g.double()
            m64 = beta1 * m.double() + (1 - beta1) * g64
            v64 = beta2 * v.double() + (1 - beta2) * g64 * g64
            m.copy_(m64)
            v.copy_(v64)
            x = p.double()
            x = x - lr * (m64 / c1 / (torch.sqrt(v64 / c2) + eps) + wd * x)
            p.copy_(x)

    def state(self):
        """Tensors to save, by name, and the step count."""
        return self.m, self.v, self.t

    def load(self, m, v, t):
        with torch.no_grad():
            for dst, src in zip(self.m, m):
                dst.copy_(src)
            for dst, src in zip(self.v, v):
                dst.copy_(src)
        self.t = t
