"""The worker protocol's framing (PROTOCOL.md in model/engine/torch is
the reference; model/engine/torch/protocol.go the other end).

A frame is a u32 little-endian length of what follows, then:

  magic "CMTW", u16 version, u8 op, u8 flags (0), u32 request id,
  u32 meta length, u32 tensor count,
  meta (a UTF-8 JSON object: the request's scalars),
  per tensor: u8 dtype, u8 ndim, u16 reserved (0), u32 dims[ndim], raw
  little-endian data (product of dims × element size bytes).
"""

import json
import struct

import torch

from . import PROTOCOL_VERSION
from .safetensors_io import tensor_bytes

MAGIC = b"CMTW"
MAX_FRAME = 1 << 30
MAX_META = 16 << 20
MAX_TENSORS = 1 << 16
MAX_NDIM = 8
HEADER = struct.Struct("<4sHBBIII")

# Ops. Requests from the Go side, replies and events from the worker.
HELLO, OPEN, LOGPROBS, TRAIN, GRAD, GENERATE, TOKEN, CONTINUE, STOP = 1, 2, 3, 4, 5, 6, 7, 8, 9
LOAD, EXPORT, RESET, CHECKPOINT, RESTORE, SHUTDOWN, DEVICE = 10, 11, 12, 13, 14, 15, 16
RESULT, ERROR = 100, 101

F32, I32, U8, F64, I64 = 1, 2, 3, 4, 5
_DT = {F32: (torch.float32, 4), I32: (torch.int32, 4), U8: (torch.uint8, 1), F64: (torch.float64, 8), I64: (torch.int64, 8)}
_CODE = {v[0]: k for k, v in _DT.items()}


class ProtocolError(Exception):
    pass


class Frame:
    def __init__(self, op, rid=0, meta=None, tensors=None):
        self.op, self.id = op, rid
        self.meta = meta if meta is not None else {}
        self.tensors = tensors if tensors is not None else []


def _read_exact(sock, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("connection closed")
        got += k
    return buf


def read(sock):
    (n,) = struct.unpack("<I", _read_exact(sock, 4))
    if n < HEADER.size or n > MAX_FRAME:
        raise ProtocolError("frame of %d bytes" % n)
    body = _read_exact(sock, n)
    magic, ver, op, flags, rid, mlen, nt = HEADER.unpack_from(body, 0)
    if magic != MAGIC:
        raise ProtocolError("bad magic %r" % bytes(magic))
    if ver != PROTOCOL_VERSION:
        raise ProtocolError("protocol version %d, this worker speaks %d" % (ver, PROTOCOL_VERSION))
    off = HEADER.size
    if mlen > MAX_META or off + mlen > n or nt > MAX_TENSORS:
        raise ProtocolError("meta of %d bytes, %d tensors in a frame of %d" % (mlen, nt, n))
    meta = {}
    if mlen:
        try:
            meta = json.loads(bytes(body[off : off + mlen]).decode("utf-8"))
        except ValueError as e:
            raise ProtocolError("meta: %s" % e)
        if not isinstance(meta, dict):
            raise ProtocolError("meta is not a JSON object")
    off += mlen
    tensors = []
    for _ in range(nt):
        if off + 4 > n:
            raise ProtocolError("tensor header beyond the frame")
        code, ndim, _r = struct.unpack_from("<BBH", body, off)
        off += 4
        if code not in _DT or ndim > MAX_NDIM or off + 4 * ndim > n:
            raise ProtocolError("tensor of dtype %d with %d dimensions" % (code, ndim))
        dims = list(struct.unpack_from("<%dI" % ndim, body, off))
        off += 4 * ndim
        dt, size = _DT[code]
        count = 1
        for d in dims:
            count *= d
        if off + count * size > n:
            raise ProtocolError("tensor data beyond the frame")
        if count:
            t = torch.frombuffer(body, dtype=dt, count=count, offset=off).reshape(dims).clone()
        else:
            t = torch.zeros(dims, dtype=dt)
        off += count * size
        tensors.append(t)
    if off != n:
        raise ProtocolError("%d bytes after the last tensor" % (n - off))
    return Frame(op, rid, meta, tensors)


def write(sock, frame):
    meta = json.dumps(frame.meta, separators=(",", ":"), allow_nan=False).encode("utf-8")
    parts = [None, meta]
    size = HEADER.size + len(meta)
    for t in frame.tensors:
        t = t.detach().to("cpu").contiguous()
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        code = _CODE.get(t.dtype)
        if code is None:
            raise ProtocolError("cannot send dtype %s" % t.dtype)
        h = struct.pack("<BBH", code, t.dim(), 0) + struct.pack("<%dI" % t.dim(), *t.shape)
        b = tensor_bytes(t)
        parts.extend((h, b))
        size += len(h) + len(b)
    if size > MAX_FRAME:
        raise ProtocolError("frame of %d bytes" % size)
    parts[0] = struct.pack("<I", size) + HEADER.pack(MAGIC, PROTOCOL_VERSION, frame.op, 0, frame.id, len(meta), len(frame.tensors))
    sock.sendall(b"".join(parts))
