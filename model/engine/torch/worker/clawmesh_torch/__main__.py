"""The worker process: python3 -m clawmesh_torch --socket PATH.

It connects to the Go side's Unix socket (rank 0 only, under torchrun),
says HELLO, and serves one request at a time until SHUTDOWN or the
connection closes. Logs go to stderr as JSON lines ({"level", "msg", ...}),
which the Go side forwards through slog. An error answers the request (with
a code: oom, bad_input, adapter, config, model, internal) and the worker
goes on serving; out of memory leaves it usable with a smaller batch."""

import argparse
import json
import os
import socket
import sys
import time
import traceback

import torch

from . import PROTOCOL_VERSION
from . import protocol as P
from .engine import Dist, Engine, error_code, is_oom


class Log:
    def __init__(self, rank):
        self.rank = rank

    def __call__(self, level, msg, **attrs):
        rec = {"level": level, "msg": msg}
        if self.rank:
            rec["rank"] = self.rank
        rec.update(attrs)
        sys.stderr.write(json.dumps(rec, default=str) + "\n")
        sys.stderr.flush()


def _recipe(meta):
    return meta.get("recipe") or {}


def serve(sock, dist, log):
    eng = None
    crash = None  # [op, count]: the test hook simulate_crash (exit on the count-th such request)
    while True:
        if dist.rank == 0:
            try:
                f = P.read(sock)
            except (EOFError, ConnectionError):
                f = P.Frame(P.SHUTDOWN)
            req = (f.op, f.id, f.meta, f.tensors)
        else:
            req = None
        op, rid, meta, tensors = dist.broadcast(req)
        if op == P.SHUTDOWN:
            if dist.rank == 0:
                try:
                    P.write(sock, P.Frame(P.RESULT, rid))
                except OSError:
                    pass
            return
        if crash and op == crash[0]:
            crash[1] -= 1
            if crash[1] <= 0:
                log("warn", "simulated crash", op=op)
                os._exit(3)
        started = time.time()
        try:
            reply = handle(op, rid, meta, tensors, eng, dist, log, sock)
            if op == P.OPEN:
                eng, reply = reply
                if meta.get("simulate_crash"):
                    crash = list(meta["simulate_crash"])
        except Exception as e:
            code = error_code(e)
            if code == "internal":
                log("error", "request failed", op=op, error=repr(e), trace=traceback.format_exc())
            elif code == "oom":
                log("warn", "out of memory", op=op, error=str(e)[:500])
            reply = P.Frame(P.ERROR, rid, {"code": code, "message": str(e)[:4000]})
            if eng is not None and is_oom(e):
                eng._free()
        if dist.rank == 0:
            reply.id = rid
            P.write(sock, reply)
        log("debug", "request", op=op, seconds=round(time.time() - started, 4))


def handle(op, rid, meta, tensors, eng, dist, log, sock):
    if op == P.OPEN:
        if eng is not None:
            raise ValueError("model already open")
        e = Engine(meta, dist, log)
        log("info", "model open", **{k: v for k, v in e.info().items() if k in ("name", "device", "dtype", "params", "lora_params", "world_size")})
        return e, P.Frame(P.RESULT, rid, e.info())
    if eng is None:
        raise ValueError("no model open")
    if op == P.LOGPROBS:
        lengths, tokens = tensors
        seqs, off = [], 0
        flat = tokens.tolist()
        for n in lengths.tolist():
            seqs.append(flat[off : off + n])
            off += n
        lps = eng.logprobs(seqs, bool(meta.get("base")))
        out = torch.tensor([x for lp in lps for x in lp], dtype=torch.float32)
        return P.Frame(P.RESULT, rid, {}, [out])
    if op in (P.TRAIN, P.GRAD):
        batch = eng._batch(meta, tensors)
        rc = _recipe(meta)
        if op == P.TRAIN:
            stats = eng.train(batch, rc)
            return P.Frame(P.RESULT, rid, stats)
        grads, stats = eng.gradient(batch, rc)
        names = [n for n, _ in eng.lora.named()]
        stats["names"] = names
        return P.Frame(P.RESULT, rid, stats, [g.float().cpu() for g in grads])
    if op == P.GENERATE:
        if dist.rank != 0:
            return P.Frame(P.RESULT, rid)
        stream = bool(meta.get("stream"))

        def on_token(tid, lp, top_ids, top_lps):
            if not stream:
                return True
            P.write(sock, P.Frame(P.TOKEN, rid, {"id": tid, "logprob": lp},
                                  [torch.tensor(top_ids, dtype=torch.int32), torch.tensor(top_lps, dtype=torch.float32)]))
            ans = P.read(sock)
            if ans.op == P.CONTINUE:
                return True
            if ans.op == P.STOP:
                return False
            raise P.ProtocolError("op %d during generation" % ans.op)

        toks, lps = eng.generate(tensors[0].tolist(), meta, on_token)
        return P.Frame(P.RESULT, rid, {}, [torch.tensor(toks, dtype=torch.int32), torch.tensor(lps, dtype=torch.float32)])
    if op == P.LOAD:
        eng.load(meta["dir"])
        return P.Frame(P.RESULT, rid, eng.info())
    if op == P.EXPORT:
        eng.export(meta["dir"], meta.get("base_model"))
        return P.Frame(P.RESULT, rid)
    if op == P.RESET:
        eng.reset(meta.get("seed", 0))
        return P.Frame(P.RESULT, rid, eng.info())
    if op == P.CHECKPOINT:
        eng.checkpoint(meta["dir"])
        return P.Frame(P.RESULT, rid)
    if op == P.RESTORE:
        eng.restore(meta["dir"])
        return P.Frame(P.RESULT, rid, eng.info())
    if op == P.DEVICE:
        return P.Frame(P.RESULT, rid, eng.device_stats(int(meta.get("matmul") or 0), bool(meta.get("reset_peak"))))
    raise ValueError("unknown op %d" % op)


def main():
    ap = argparse.ArgumentParser(prog="python3 -m clawmesh_torch", description="clawmesh's torch worker (started by the Go trainer)")
    ap.add_argument("--socket", required=True, help="the Go side's Unix socket")
    a = ap.parse_args()
    dist = Dist()
    log = Log(dist.rank)
    sock = None
    if dist.rank == 0:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(a.socket)
        P.write(sock, P.Frame(P.HELLO, 0, {
            "protocol": PROTOCOL_VERSION, "torch": torch.__version__, "pid": os.getpid(),
            "cuda": torch.cuda.is_available(), "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "world_size": dist.world,
        }))
    try:
        serve(sock, dist, log)
    finally:
        if sock is not None:
            sock.close()
        if dist.on:
            dist.dist.destroy_process_group()


if __name__ == "__main__":
    main()
