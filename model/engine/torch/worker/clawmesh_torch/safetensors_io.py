"""Reads and writes .safetensors files with the standard library and torch
(no safetensors package): u64 little-endian header length, a JSON header,
then the raw little-endian tensor data."""

import ctypes
import json
import mmap
import os
import struct
import sys
import warnings

import torch

DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
}
NAMES = {v[0]: k for k, v in DTYPES.items()}


class FormatError(ValueError):
    pass


if sys.byteorder != "little":  # torch.frombuffer reads native order
    raise ImportError("clawmesh_torch needs a little-endian host")


class File:
    """A memory-mapped .safetensors file; get(name) copies one tensor out."""

    def __init__(self, path):
        self.path = path
        f = open(path, "rb")
        try:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise FormatError("%s: too short" % path)
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        finally:
            f.close()
        (n,) = struct.unpack("<Q", self.mm[:8])
        if n > size - 8 or n > 100 << 20:
            raise FormatError("%s: header of %d bytes" % (path, n))
        try:
            header = json.loads(self.mm[8 : 8 + n].decode("utf-8"))
        except ValueError as e:
            raise FormatError("%s: header: %s" % (path, e))
        if not isinstance(header, dict):
            raise FormatError("%s: header is not an object" % path)
        self.metadata = header.pop("__metadata__", None) or {}
        self.base = 8 + n
        self.size = size
        self.info = {}
        for name, info in header.items():
            dt = info.get("dtype") if isinstance(info, dict) else None
            if dt not in DTYPES:
                raise FormatError("%s: %s: unsupported dtype %r" % (path, name, dt))
            shape = [int(d) for d in info["shape"]]
            lo, hi = (int(x) for x in info["data_offsets"])
            count = 1
            for d in shape:
                if d < 0:
                    raise FormatError("%s: %s: negative dimension" % (path, name))
                count *= d
            if hi - lo != count * DTYPES[dt][1] or lo < 0 or self.base + hi > size:
                raise FormatError("%s: %s: bad data_offsets" % (path, name))
            self.info[name] = (dt, shape, lo, hi)

    def names(self):
        return list(self.info)

    def shape(self, name):
        return list(self.info[name][1])

    def get(self, name, dtype=None, device="cpu"):
        dt, shape, lo, hi = self.info[name]
        tdt = DTYPES[dt][0]
        if hi == lo:
            t = torch.zeros(shape, dtype=tdt)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the map is read-only; we copy
                t = torch.frombuffer(self.mm, dtype=tdt, count=(hi - lo) // DTYPES[dt][1], offset=self.base + lo)
            t = t.reshape(shape)
        return t.to(device=device, dtype=dtype or tdt, copy=True)

    def close(self):
        self.mm.close()


def tensor_bytes(t):
    """The raw bytes of a tensor, little-endian (no numpy needed)."""
    t = t.detach().to("cpu").contiguous()
    n = t.numel() * t.element_size()
    if n == 0:
        return b""
    return bytes((ctypes.c_char * n).from_address(t.data_ptr()))


def write(path, tensors, metadata=None):
    """Writes {name: tensor} (sorted by name) to path atomically."""
    header = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    blobs = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in NAMES:
            raise FormatError("%s: dtype %s" % (name, t.dtype))
        b = tensor_bytes(t)
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
