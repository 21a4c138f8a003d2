"""recal.read_safetensors: the BatchNorm buffers artifact (download(..., artifact="bn")) read
with no package beyond the standard library.

Hand-written because the format is small and this keeps the client free of the
`safetensors` package: 8 bytes of little-endian header length N, N bytes of JSON
{"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__":
{...}}, then the tensors' little-endian bytes, offsets counted from the end of the header.
It is strict, as the reference implementation is: a bounded header, offsets inside the
file, each tensor's bytes its shape's size, the tensors contiguous, not overlapping and
covering the data exactly; anything else is refused before anything is allocated for it.
"""

import collections
import json
import math
import os
import struct

import grpc

from recal.errors import RecalError

# The reference implementation's bound: a larger header is refused unread.
MAX_HEADER_BYTES = 100 << 20
# dtype -> (bytes per value, numpy's little-endian dtype; None: numpy has no such type)
_DTYPES = {"F64": (8, "<f8"), "F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, None), "I64": (8, "<i8"),
           "I32": (4, "<i4"), "I16": (2, "<i2"), "I8": (1, "i1"), "U8": (1, "u1"), "U16": (2, "<u2"),
           "U32": (4, "<u4"), "U64": (8, "<u8"), "BOOL": (1, "?")}

# A tensor as it is in the file, for when neither torch nor numpy is there.
RawTensor = collections.namedtuple("RawTensor", ("dtype", "shape", "data"))


def read_safetensors(path, to="auto"):
    """{name: tensor} of a safetensors file. to: "torch" (torch tensors), "numpy" (arrays),
    "raw" (RawTensor(dtype name, shape tuple, little-endian bytes)), or "auto": torch when it
    can be imported, else numpy, else raw. A malformed file raises RecalError(DATA_LOSS)."""
    with open(path, "rb") as f:
        data = f.read()
    entries = _entries(data, path)
    convert = _converter(to)
    return {name: convert(dtype, shape, data[begin:end]) for name, (dtype, shape, begin, end) in entries.items()}


def _bad(path, why):
    return RecalError(grpc.StatusCode.DATA_LOSS, "%s is not a valid safetensors file: %s; download the "
                      "artifact again (client.download(job, path, artifact=\"bn\"))" % (path, why))


def _entries(data, path):
    """{name: (dtype, shape, begin, end)} with absolute byte offsets, every rule checked."""
    if len(data) < 8:
        raise _bad(path, "%d bytes, shorter than the 8-byte header length" % len(data))
    (header_bytes,) = struct.unpack("<Q", data[:8])
    if header_bytes > MAX_HEADER_BYTES or header_bytes > len(data) - 8:
        raise _bad(path, "a header of %d bytes (the file has %d, the limit is %d)"
                   % (header_bytes, len(data), MAX_HEADER_BYTES))
    header = _parse_header(data[8:8 + header_bytes], path)
    base = 8 + header_bytes
    entries = {name: _entry(name, info, path) for name, info in header.items() if name != "__metadata__"}
    position = 0
    for name, (dtype, shape, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if begin != position:
            raise _bad(path, "%r starts at byte %d of the data, expected %d (a gap or an overlap)"
                       % (name, begin, position))
        position = end
    if position != len(data) - base:
        raise _bad(path, "the tensors cover %d bytes of data, the file holds %d" % (position, len(data) - base))
    return {name: (dtype, shape, base + begin, base + end) for name, (dtype, shape, begin, end) in entries.items()}


def _parse_header(text, path):
    def unique(pairs):
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            raise _bad(path, "a key appears twice in the header")
        return dict(pairs)

    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=unique)
    except (UnicodeDecodeError, ValueError) as error:
        raise _bad(path, "the header is not JSON (%s)" % error) from None
    if not isinstance(header, dict):
        raise _bad(path, "the header is not a JSON object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _bad(path, "__metadata__ is not an object of strings")
    return header


def _entry(name, info, path):
    """(dtype, shape, begin, end) of one tensor's header entry, its size checked."""
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise _bad(path, "%r needs exactly dtype, shape and data_offsets" % name)
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in _DTYPES:
        raise _bad(path, "%r has dtype %r (known: %s)" % (name, dtype, ", ".join(sorted(_DTYPES))))
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise _bad(path, "%r has shape %r" % (name, shape))
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(n) for n in offsets) \
            or offsets[0] > offsets[1]:
        raise _bad(path, "%r has data_offsets %r" % (name, offsets))
    size = math.prod(shape) * _DTYPES[dtype][0]
    if offsets[1] - offsets[0] != size:
        raise _bad(path, "%r is %s %s (%d bytes) but spans %d bytes" % (name, dtype, shape, size,
                                                                       offsets[1] - offsets[0]))
    return dtype, tuple(shape), offsets[0], offsets[1]


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _converter(to):
    if to == "auto":
        for available in ("torch", "numpy"):
            try:
                return _converter(available)
            except ImportError:
                pass
        return RawTensor
    if to == "torch":
        import torch

        return _torch_tensor(torch)
    if to == "numpy":
        import numpy

        return _numpy_array(numpy)
    if to == "raw":
        return RawTensor
    raise ValueError("to must be 'auto', 'torch', 'numpy' or 'raw', not %r" % (to,))


def _torch_tensor(torch):
    dtypes = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
              "U8": torch.uint8, "BOOL": torch.bool}

    def convert(dtype, shape, raw):
        if dtype not in dtypes:  # U16 / U32 / U64: torch has no full support; numpy does
            raise RecalError(grpc.StatusCode.UNIMPLEMENTED, "a %s tensor has no torch dtype here; read the "
                             "file with read_safetensors(path, to=\"numpy\")" % dtype)
        if not raw:
            return torch.empty(shape, dtype=dtypes[dtype])
        # The file's bytes are little-endian, as the CPUs torch runs on are.
        return torch.frombuffer(bytearray(raw), dtype=dtypes[dtype]).reshape(shape)

    return convert


def _numpy_array(numpy):
    def convert(dtype, shape, raw):
        numpy_dtype = _DTYPES[dtype][1]
        if numpy_dtype is None:  # BF16: the high half of a float32
            halves = numpy.frombuffer(raw, dtype="<u2").astype("<u4")
            return (halves << 16).view("<f4").reshape(shape)
        return numpy.frombuffer(raw, dtype=numpy_dtype).reshape(shape).copy()

    return convert
