#!/usr/bin/env python3
"""Seed inputs for the fuzz targets (fuzz/*_fuzzer.cc), one folder per target.

    .venv/bin/python fuzz/make_corpus.py OUT               # every seed, into OUT/<target>/
    .venv/bin/python fuzz/make_corpus.py --max-bytes 512 fuzz/corpus   # the committed ones
    .venv/bin/python fuzz/make_corpus.py --fixtures build/fixtures/models OUT pt2_archive

scripts/fuzz.sh writes the full set into build-fuzz/corpus/ (libFuzzer adds what it finds
there); the small ones are committed under fuzz/corpus/ so that the default build's
<target>_replay tests run them without Python. Deterministic: the same files every run.
Needs numpy and PIL (Debian's python3-numpy, python3-pil); protobuf messages are encoded by
hand (no generated modules needed). The PT2 seeds (pt2_archive, program_plan) are the small
exported programs the default build's fixtures target writes (--fixtures, default
build/fixtures/models; never committed): where there are none, two made here with torch.export
(the venv's torch).
"""
import argparse
import functools
import hashlib
import io
import json
import os
import struct
import sys
import tempfile
import zipfile
import zlib

import numpy as np
from PIL import Image

# ---------------------------------------------------------------- protobuf wire format


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(field, n):
    return varint(field << 3) + varint(n)


def f_bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def f_floats(field, values):  # packed repeated float
    return f_bytes(field, b"".join(struct.pack("<f", v) for v in values))


def f_float(field, value):
    return varint(field << 3 | 5) + struct.pack("<f", value)


def f_varints(field, values):  # packed repeated int64
    return f_bytes(field, b"".join(varint(v) for v in values))


# ---------------------------------------------------------------- .npy


def npy(array, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array, allow_pickle=False)
    else:
        np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def npy_seeds():
    rng = np.random.default_rng(0)
    yield "f32_2x3.npy", npy(rng.standard_normal((2, 3)).astype(np.float32))
    yield "u8_3x2x2.npy", npy(np.arange(12, dtype=np.uint8).reshape(3, 2, 2))
    yield "i64_5.npy", npy(np.arange(5, dtype=np.int64))
    yield "f16_1x2.npy", npy(np.array([[1.5, -2]], dtype=np.float16))
    yield "f64_0d.npy", npy(np.float64(3.25))
    yield "bool_2x2.npy", npy(np.array([[True, False], [False, True]]))
    yield "bool_bytes.npy", npy(np.array([[True, False], [False, True]]))[:-4] + b"\x01\x00\x9d\x01"
    yield "i8_4.npy", npy(np.array([-1, 2, -3, 4], dtype=np.int8))
    yield "i16_i32.npy", npy(np.array([1, 2], dtype=np.int32))
    yield "empty_0x3.npy", npy(np.zeros((0, 3), dtype=np.float32))
    yield "zero_3x0.npy", npy(np.zeros((3, 0), dtype=np.float32))
    yield "v2_f32.npy", npy(np.ones((2, 2), dtype=np.float32), version=(2, 0))
    yield "v3_u8.npy", npy(np.ones((3,), dtype=np.uint8), version=(3, 0))
    yield "fortran.npy", npy(np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    yield "bigendian.npy", npy(np.arange(3, dtype=">f4"))
    yield "structured.npy", npy(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))
    yield "truncated.npy", npy(np.arange(8, dtype=np.float32))[:-5]
    yield "u8_4x3x8x8.npy", npy(rng.integers(0, 256, (4, 3, 8, 8), dtype=np.uint8))  # not committed
    # Hand-written headers: Python 2 longs, double quotes, no trailing comma, big dims.
    for name, text in [
        ("py2_long.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 1L), }"),
        ("dquote.npy", '{"descr": "<f4", "fortran_order": False, "shape": (1,)}'),
        ("huge_dims.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 9223372036854775807, 2), }"),
        ("overflow.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }"),
    ]:
        header = text.encode() + b" " * ((64 - (len(text) + 11) % 64) % 64) + b"\n"
        yield name, b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(8)


# ---------------------------------------------------------------- safetensors


def safetensors(header_json, data, pad=True):
    h = header_json.encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    a = np.arange(6, dtype=np.float32).tobytes()
    yield "one.safetensors", safetensors('{"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}', a)
    yield "two_meta.safetensors", safetensors(
        '{"__metadata__":{"format":"pt"},"a":{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]},'
        '"b":{"dtype":"I64","shape":[2],"data_offsets":[8,24]}}', bytes(range(24)))
    yield "unpadded.safetensors", safetensors(
        '{"h":{"dtype":"F16","shape":[1,2],"data_offsets":[0,4]},"z":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]}}',
        bytes(6), pad=False)
    yield "scalar.safetensors", safetensors('{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}', bytes(8))
    yield "empty.safetensors", safetensors('{"e":{"dtype":"BOOL","shape":[0,5],"data_offsets":[0,0]}}', b"")
    yield "empty_huge.safetensors", safetensors(
        '{"e":{"dtype":"F64","shape":[0,9007199254740992,9007199254740992],"data_offsets":[0,0]}}', b"")
    yield "overlap.safetensors", safetensors(
        '{"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[1],"data_offsets":[2,6]}}',
        bytes(8))
    yield "dims_differ.safetensors", safetensors(
        '{"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"I16","shape":[3],"data_offsets":[2,8]}}',
        bytes(8))
    yield "escapes.safetensors", safetensors(
        '{"q\\"\\u0001\\u00e9":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"__metadata__":{"k":"v\\n"}}', b"\x07")
    yield "floats.safetensors", safetensors('{"f":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4e0]}}', bytes(4))
    yield "nometa.safetensors", safetensors('{}', b"")


# ---------------------------------------------------------------- data specs


def data_spec_seeds():
    specs = [
        "npy:data/x.npy",
        "npy:x_uint8.npy?scale=255&mean=0.485,0.456,0.406&std=0.229,0.224,0.225",
        "npy:a?b.npy?",
        "safetensors:/d/x.safetensors:a,b",
        "safetensors:/a:b.st:",
        "safetensors:x.st:k?scale=2",
        "torch:x.pt",
        "torch:x.pt?mean=1e-300&std=1e300",
        "synthetic:3x224x224",
        "synthetic:3x32x32,seed=18446744073709551615",
        "synthetic:65536x32768",
        "images:calib/imgs?resize=36&crop=32&mean=0.485,0.456,0.406&std=0.229,0.224,0.225",
        "images:d?x?resize=256&crop=224&mean=0,0,0&std=1,1,1&samples=10&seed=3&shuffle=1&on_bad=skip",
        "images:d?resize=4&crop=8&mean=0,0,0&std=1,1,1",
        "npy:x?scale=-1",
        "bogus:x",
    ]
    for i, spec in enumerate(specs):
        yield "spec%02d.txt" % i, spec.encode()


# ---------------------------------------------------------------- recal.v1.DataSource


def tensor_file(fmt, path, keys=(), mean=(), std=(), scale=None):
    m = f_varint(1, fmt) + f_bytes(2, path)
    for k in keys:
        m += f_bytes(3, k)
    if mean:
        m += f_floats(4, mean)
    if std:
        m += f_floats(5, std)
    if scale is not None:
        m += f_float(6, scale)
    return f_bytes(1, m)


def image_folder(path, resize, crop, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), samples=0, shuffle=False, seed=0,
                 on_bad=0):
    m = f_bytes(1, path) + f_varint(2, resize) + f_varint(3, crop) + f_floats(4, mean) + f_floats(5, std)
    if samples:
        m += f_varint(6, samples)
    if shuffle:
        m += f_varint(7, 1)
    if seed:
        m += f_varint(8, seed)
    if on_bad:
        m += f_varint(9, on_bad)
    return f_bytes(4, m)


def data_source_seeds():
    NPY, SAFETENSORS, TORCH = 1, 2, 3
    yield "npy.pb", tensor_file(NPY, "x.npy")
    yield "npy_norm.pb", tensor_file(NPY, "x.npy", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), scale=255)
    yield "safetensors_keys.pb", tensor_file(SAFETENSORS, "x.safetensors", keys=("a", "b"))
    yield "torch.pb", tensor_file(TORCH, "x.pt")
    yield "second_root.pb", tensor_file(NPY, "y.npy")
    yield "dotdot.pb", tensor_file(NPY, "../outside/secret.npy")
    yield "link_dir_out.pb", tensor_file(NPY, "out/secret.npy")
    yield "link_file_out.pb", tensor_file(NPY, "secret.npy")
    yield "absolute.pb", tensor_file(NPY, "/etc/passwd")
    yield "missing.pb", tensor_file(TORCH, "nope.pt")
    yield "bad_key.pb", tensor_file(SAFETENSORS, "x.safetensors", keys=("a,b",))
    yield "bad_std.pb", tensor_file(NPY, "x.npy", mean=(0.0,), std=(0.0,))
    yield "images.pb", image_folder("images", 36, 32)
    yield "images_opts.pb", image_folder("pics", 256, 224, samples=5, shuffle=True, seed=9, on_bad=2)
    yield "images_out.pb", image_folder("out/images", 8, 8)
    yield "images_file.pb", image_folder("x.npy", 8, 8)
    yield "images_crop.pb", image_folder("images", 8, 9)
    yield "synthetic.pb", f_bytes(2, f_varints(1, [3, 8, 8]) + f_varint(2, 7))
    yield "synthetic_big.pb", f_bytes(2, f_varints(1, [65536, 65536]))
    yield "synthetic_neg.pb", f_bytes(2, f_varints(1, [3, -1]) + f_varint(2, -5))
    yield "client_stream.pb", f_bytes(3, f_floats(1, (0.5,) * 3) + f_floats(2, (0.25,) * 3) + f_float(3, 255))
    yield "nothing.pb", b""


# ---------------------------------------------------------------- PushBatchesRequest

FLOAT32, FLOAT16, UINT8 = 1, 2, 3


def tensor(dtype, shape, data):
    return f_varint(1, dtype) + f_varints(2, shape) + f_bytes(3, data)


def push(inputs, last=False, norm=None):
    m = f_bytes(1, "job-1")
    for t in inputs:
        m += f_bytes(2, t)
    if last:
        m += f_varint(3, 1)
    if norm is not None:  # the job's ClientStreamSource, field 15 of the fuzz input (not of the API)
        m += f_bytes(15, norm)
    return m


def pushed_batches_seeds():
    norm3 = f_floats(1, (0.485, 0.456, 0.406)) + f_floats(2, (0.229, 0.224, 0.225)) + f_float(3, 255)
    yield "f32.pb", push([tensor(FLOAT32, [2, 3], np.arange(6, dtype=np.float32).tobytes())])
    yield "u8_norm.pb", push([tensor(UINT8, [1, 3, 2, 2], bytes(range(12)))], norm=norm3)
    yield "f16_last.pb", push([tensor(FLOAT16, [2, 1], np.array([1, -2], dtype=np.float16).tobytes())], last=True)
    yield "two_inputs.pb", push([tensor(FLOAT32, [1, 2], bytes(8)), tensor(UINT8, [1, 5], bytes(5))])
    yield "scale_only.pb", push([tensor(UINT8, [2, 2], b"\x00\x7f\x80\xff")], norm=f_float(3, 255))
    yield "last_only.pb", push([], last=True)
    yield "job_id_only.pb", f_bytes(1, "job-1")
    yield "short_data.pb", push([tensor(FLOAT32, [2, 3], bytes(20))])
    yield "no_batch_dim.pb", push([tensor(UINT8, [], b"\x01")])
    yield "dim0_differs.pb", push([tensor(UINT8, [1, 1], b"\x01"), tensor(UINT8, [2, 1], b"\x01\x02")])
    yield "huge_dims.pb", push([tensor(UINT8, [2, 1 << 62], b"")])
    yield "channels.pb", push([tensor(UINT8, [1, 2], b"\x01\x02")], norm=norm3)
    yield "bad_dtype.pb", push([tensor(0, [1], b"\x01")])


# ---------------------------------------------------------------- images


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_raw(width, height, depth, color_type, pixels, interlace=0, extra=b""):
    """8-bit samples only when interlaced; `pixels` rows of bytes (filter 0 added here)."""
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type]
    if interlace:
        bpp = channels * depth // 8
        raw = b""
        for x0, y0, dx, dy in [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                               (0, 1, 1, 2)]:
            for y in range(y0, height, dy):
                row = b"".join(pixels[y][x * bpp:(x + 1) * bpp] for x in range(x0, width, dx))
                if row:
                    raw += b"\x00" + row
    else:
        raw = b"".join(b"\x00" + row for row in pixels)
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, interlace)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra + png_chunk(b"IDAT", zlib.compress(raw, 9)) +
            png_chunk(b"IEND", b""))


def pil(image, fmt, **kw):
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def image_seeds():
    rng = np.random.default_rng(1)
    rgb = Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8), "RGB")
    gray = Image.fromarray(rng.integers(0, 256, (5, 7), dtype=np.uint8), "L")
    yield "rgb.png", pil(rgb, "PNG")
    yield "gray.png", pil(gray, "PNG")
    yield "rgba.png", pil(rgb.convert("RGBA"), "PNG")
    yield "la.png", pil(gray.convert("LA"), "PNG")
    yield "palette.png", pil(rgb.convert("P", palette=Image.ADAPTIVE, colors=4), "PNG", bits=2)
    yield "palette_trns.png", pil(rgb.convert("P", palette=Image.ADAPTIVE, colors=4), "PNG", bits=2, transparency=1)
    yield "bilevel.png", pil(gray.convert("1"), "PNG")
    yield "gray16.png", png_raw(3, 2, 16, 0, [bytes(range(6)), bytes(range(250, 256))])
    yield "rgb16.png", png_raw(2, 2, 16, 2, [bytes(range(12)), bytes(range(12, 24))])
    yield "gray2.png", png_raw(5, 2, 2, 0, [b"\x1b\xc0", b"\xe4\x40"])
    yield "interlaced.png", png_raw(9, 9, 8, 2, [bytes(rng.integers(0, 256, 27, dtype=np.uint8)) for _ in range(9)],
                                    interlace=1)
    yield "gamma_trns.png", png_raw(2, 2, 8, 0, [b"\x10\x20", b"\x30\x40"],
                                    extra=png_chunk(b"gAMA", struct.pack(">I", 45455)) +
                                    png_chunk(b"tRNS", b"\x00\x10"))
    full = png_raw(4, 4, 8, 2, [bytes(12)] * 4)
    yield "truncated.png", full[:len(full) - 20]
    yield "bad_crc.png", full[:30] + b"\x00" + full[31:]
    yield "gray.jpg", pil(gray, "JPEG", quality=50, optimize=True)
    yield "rgb444.jpg", pil(rgb, "JPEG", quality=50, subsampling=0, optimize=True)
    yield "rgb420.jpg", pil(rgb, "JPEG", quality=20, subsampling=2, optimize=True)
    yield "progressive.jpg", pil(gray, "JPEG", quality=30, progressive=True)
    yield "cmyk.jpg", pil(rgb.convert("CMYK"), "JPEG", quality=20, optimize=True)
    jpg = pil(gray, "JPEG", quality=50, optimize=True)
    yield "truncated.jpg", jpg[:len(jpg) * 2 // 3]
    yield "not_an_image.png", b"GIF89a\x01\x00\x01\x00"
    # Larger ones (not committed): more than one MCU row, and more than one IDAT read.
    photo = Image.fromarray(np.kron(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), np.ones((8, 8, 1), np.uint8)),
                            "RGB")
    yield "photo_48x64.jpg", pil(photo, "JPEG", quality=75)
    yield "photo_48x64.png", pil(photo, "PNG")


# ---------------------------------------------------------------- auth file


def auth_file_seeds():
    h = hashlib.sha256(b"recal_example").hexdigest()
    yield "full.txt", ("# tokens, certs, tenants\n"
                       f"token-sha256:{h} tenant=vision role=submit\n"
                       'cert:"trainer a.example" tenant=vision role=read max_active_jobs=3\n'
                       "cert:admin.example tenant=ops role=admin\n"
                       "tenant vision max_active_jobs=3 max_stored_bytes=50000000000 max_submissions_per_minute=120\n"
                       ).encode()
    yield "quota_conflict.txt", b"tenant a max_active_jobs=1\ntenant a max_active_jobs=2\n"
    yield "bad_hash.txt", b"token-sha256:ABC tenant=a role=read\n"
    yield "bad_role.txt", ("token-sha256:" + h + " tenant=a role=root\n").encode()
    yield "open_quote.txt", b'cert:"x tenant=a role=read\n'
    yield "twice.txt", b"cert:x tenant=a role=read\ncert:x tenant=b role=read\n"
    yield "crlf.txt", b"tenant t1\r\ntenant t2 max_stored_bytes=0\r\n"
    yield "empty.txt", b""


# ---------------------------------------------------------------- UploadModelRequest


def upload(name, size, sha, labels=()):
    m = f_bytes(1, name) + f_varint(2, size) + f_bytes(3, sha)
    for k, v in labels:
        m += f_bytes(4, f_bytes(1, k) + f_bytes(2, v))
    return f_bytes(1, m)


def upload_header_seeds():
    abc = hashlib.sha256(b"abc").hexdigest()
    yield "complete.pb", upload("abc", 3, abc, [("team", "vision")])
    yield "partial.pb", upload("resnet18.pt", 44000, hashlib.sha256(b"x").hexdigest())
    yield "mismatch.pb", upload("abd", 3, abc)
    yield "zero_size.pb", upload("m", 0, abc)
    yield "negative_size.pb", upload("m", -1, abc)
    yield "too_big.pb", upload("m", 1 << 40, abc)
    yield "over_quota.pb", upload("m", 600000, abc)
    yield "path_digest.pb", upload("m", 3, "../../../../etc/passwd")
    yield "upper_digest.pb", upload("m", 3, abc.upper())
    yield "chunk_first.pb", f_bytes(2, f_varint(1, 0) + f_bytes(2, "abc"))


# ---------------------------------------------------------------- S3 XML answers


def s3_xml_seeds():
    ns = ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
    yield "list.xml", (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult%s><Name>b</Name><Prefix>p/</Prefix>'
        "<IsTruncated>true</IsTruncated><Contents><Key>p/a &amp; b</Key><ETag>&quot;e&quot;</ETag>"
        "<Size>10</Size></Contents><Contents><Key>p/c</Key><Size>0</Size></Contents>"
        "<CommonPrefixes><Prefix>p/d/</Prefix></CommonPrefixes>"
        "<NextContinuationToken>1ueGcxLPRx1Tr/XYEx=</NextContinuationToken></ListBucketResult>" % ns).encode()
    yield "list_empty.xml", b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"
    yield "list_bad_size.xml", b"<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>"
    yield "list_prefixed.xml", b"<s3:ListBucketResult><s3:Contents><s3:Key>k</s3:Key><s3:Size>1</s3:Size></s3:Contents></s3:ListBucketResult>"
    yield "initiate.xml", ("<InitiateMultipartUploadResult%s><Bucket>b</Bucket><Key>k</Key>"
                           "<UploadId>VXBsb2FkIElE</UploadId></InitiateMultipartUploadResult>" % ns).encode()
    yield "complete.xml", b'<CompleteMultipartUploadResult><Location>http://b/k</Location><ETag>"abc-2"</ETag></CompleteMultipartUploadResult>'
    yield "complete_error.xml", b"<Error><Code>InternalError</Code><Message>We encountered an internal error.</Message></Error>"
    yield "error.xml", (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>The specified key '
                        b"does not exist.</Message><Key>a/b</Key><BucketName>b</BucketName><RequestId>4442587F</RequestId></Error>")
    yield "doctype.xml", b'<!DOCTYPE l [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]><Error><Code>&b;</Code></Error>'
    yield "cdata.xml", b"<Error><Code><![CDATA[<x>]]></Code><Message>&#x41;&#65;</Message></Error>"
    yield "deep.xml", b"<a>" * 40 + b"</a>" * 40
    yield "truncated.xml", b"<ListBucketResult><Contents><Key>k"


# ---------------------------------------------------------------- a worker's reads of data in a bucket


def read_request(id_, obj, offset, length):
    # worker.v1.Event{read_request = 7: ReadRequest{id, object, offset, length}}
    return f_bytes(7, f_varint(1, id_) + f_varint(2, obj) + f_varint(3, offset) + f_varint(4, length))


def read_request_seeds():
    yield "whole_small.pb", read_request(1, 0, 0, 10)
    yield "middle.pb", read_request(2, 2, 1000, 5000)
    yield "empty_object.pb", read_request(3, 1, 0, 0)
    yield "past_end.pb", read_request(4, 0, 5, 6)
    yield "no_such_object.pb", read_request(5, 9, 0, 1)
    yield "negative.pb", read_request(6, (1 << 64) - 1, (1 << 64) - 2, 4)
    yield "too_long.pb", read_request(7, 2, 0, (8 << 20) + 1)
    yield "overflow.pb", read_request(8, 2, 1 << 62, 1 << 62)
    yield "progress.pb", f_bytes(2, f_varint(1, 3))  # another event: not a read


# -------------------------------------------------------------------- model references


def model_ref_seeds():
    digest = "8b129e" + "a" * 58
    refs = [
        "sha256:" + digest,
        digest,
        "sha256:8b129e",
        "8B129E",
        "sha256:" + digest + "0",
        "sha256:xyz123",
        "rn50",
        "rn50:3",
        "ResNet.pt:12",
        "rn50:0",
        "rn50:",
        "a:b:c",
        "deadbeef",
        "deadbeef:2",
        "sha256",
        "my model.pt",
        " rn50",
        "a/b",
        "rn50:99999999999999999999",
        "",
    ]
    for i, ref in enumerate(refs):
        yield f"ref{i:02d}.txt", ref.encode()


# -------------------------------------------------------------------- exported programs (PT2)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
fixtures_dir = os.path.join(REPO, "build", "fixtures", "models")  # main() sets --fixtures
# Small ones of tests/fixtures/exported_programs.py: each BatchNorm form (eval, train, core
# ATen), dropout, two inputs, a torch.cond, torch.no_grad / autocast regions, and stochastic
# depth in train mode (Bernoulli masks, which eval mode rewrites).
PT2_FIXTURES = ["bn1d_3d.exported_eval", "bn1d_2d.exported_train", "functional.exported_core_eval",
                "dropout.exported_train", "two_input.exported_eval", "cond_bn.exported_eval",
                "regions.exported_eval", "stochastic_depth.exported_train"]
# tests/fixtures/crafted_archives.py: a weight's record cut short (refused by Read).
CRAFTED_PT2 = os.path.join("..", "..", "crafted_archives", "truncated_weight_8.pt2")


def exported_here():
    """(name, bytes) of two tiny programs torch.export makes, for a tree without fixtures."""
    import torch  # only here: the other targets need no torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(2, 3, 3, padding=1)
            self.bn = torch.nn.BatchNorm1d(3)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    torch.manual_seed(0)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("eval", "train"):
            model = Net().eval() if mode == "eval" else Net().train()
            path = os.path.join(tmp, f"net.exported_{mode}.pt2")
            torch.export.save(torch.export.export(model, (torch.randn(2, 2, 5),)), path)
            with open(path, "rb") as f:
                out.append((f"net.exported_{mode}", f.read()))
    return out


@functools.lru_cache(maxsize=None)  # both PT2 targets' seeds come from them
def pt2_files():
    found = []
    for name in PT2_FIXTURES:
        path = os.path.join(fixtures_dir, name + ".pt2")
        if os.path.exists(path):
            with open(path, "rb") as f:
                found.append((name, f.read()))
    return tuple(found or exported_here())


def program_record(archive):
    """The name and JSON text of the archive's program (<top>/models/<name>.json)."""
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        name = next(n for n in z.namelist() if "/models/" in n and n.endswith(".json"))
        return name, z.read(name)


def compact_program(text):
    """The program without its nodes' metadata (stack traces: most of its bytes, never read)."""
    program = json.loads(text)

    def strip(graph):
        for node in graph.get("nodes", []):
            node.pop("metadata", None)
            for arg in node.get("inputs", []):
                nested = arg.get("arg", {}).get("as_graph")
                if nested:
                    strip(nested["graph"])

    strip(program["graph_module"]["graph"])
    return json.dumps(program, separators=(",", ":")).encode()


def zip_of(records, version=True):
    """A zip as PyTorchStreamReader reads it: every record under one top folder, stored, with
    the version record its constructor requires (version=False: without, which it refuses)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in [(".data/version", b"6\n")] * version + list(records):
            info = zipfile.ZipInfo("a/" + name, date_time=(1980, 1, 1, 0, 0, 0))
            z.writestr(info, data)
    return buf.getvalue()


def pt2_archive_seeds():
    # Hand-made, small (committed): each of Read's early refusals.
    yield "not_zip.pt2", b"PK\x03\x04 not a zip"
    yield "no_version.pt2", zip_of([("archive_format", b"pt2")], version=False)
    yield "no_program.pt2", zip_of([("archive_format", b"pt2")])
    yield "two_programs.pt2", zip_of([("archive_format", b"pt2"), ("models/a.json", b"{}"), ("models/b.json", b"{}")])
    yield "big_endian.pt2", zip_of([("archive_format", b"pt2"), ("byteorder", b"big"), ("models/m.json", b"{}")])
    yield "deep_json.pt2", zip_of([("archive_format", b"pt2"), ("models/m.json", b"[" * 70 + b"]" * 70)])
    config = {"config": {"w": {"path_name": "w0", "use_pickle": False, "tensor_meta": {
        "dtype": 7, "sizes": [{"as_int": 2}], "strides": [{"as_int": 1}], "storage_offset": {"as_int": 1},
        "layout": 7}}}}
    yield "float_dtype.pt2", zip_of([("archive_format", b"pt2"), ("models/m.json", b"{}"), ("data/weights/w0", bytes(8)),
                                      ("data/weights/m_weights_config.json",
                                       json.dumps(config).replace('"dtype": 7', '"dtype": 7.5').encode())])
    yield "view_past_record.pt2", zip_of([
        ("archive_format", b"pt2"), ("models/m.json", b"{}"), ("data/weights/w0", bytes(8)),
        ("data/weights/m_weights_config.json", json.dumps(config).encode()),
        ("data/constants/m_constants_config.json", b'{"config":{}}')])
    # The fixtures' archives as torch.export.save wrote them, and the smallest again with its
    # program compacted (fewer bytes for libFuzzer to mutate through).
    files = pt2_files()
    for name, data in files:
        yield name + ".pt2", data
    name, data = files[0]
    record, text = program_record(data)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        kept = [(n.split("/", 1)[1], compact_program(text) if n == record else z.read(n)) for n in z.namelist()
                if "/sample_inputs/" not in n]
    yield name + ".compact.pt2", zip_of(kept, version=False)
    crafted = os.path.join(fixtures_dir, CRAFTED_PT2)
    if os.path.exists(crafted):
        with open(crafted, "rb") as f:
            yield "truncated_weight_8.pt2", f.read()


def program(nodes, inputs=("x",), outputs=("relu",), sizes=({"as_int": 2},)):
    """A program's JSON of `nodes` over user tensor inputs (float32 of `sizes`)."""
    graph = {"inputs": [{"as_tensor": {"name": n}} for n in inputs],
             "outputs": [{"as_tensor": {"name": n}} for n in outputs], "nodes": nodes,
             "tensor_values": {n: {"dtype": 7, "sizes": list(sizes)} for n in inputs}}
    specs = [{"user_input": {"arg": {"as_tensor": {"name": n}}}} for n in inputs]
    return json.dumps({"graph_module": {"graph": graph, "signature": {"input_specs": specs}},
                       "range_constraints": {"s0": {"min_val": 2, "max_val": None}}},
                      separators=(",", ":")).encode()


def node(target, inputs, outputs=("relu",)):
    return {"target": target, "name": outputs[0], "inputs": [{"name": k, "arg": v} for k, v in inputs],
            "outputs": [{"as_tensor": {"name": n}} for n in outputs]}


def tensor_arg(name):
    return {"as_tensor": {"name": name}}


def program_plan_seeds():
    # Hand-made, small (committed): one accepted of each kind, and the refusals.
    relu = node("torch.ops.aten.relu.default", [("self", tensor_arg("x"))])
    yield "relu.json", program([relu])
    yield "dynamic.json", program([relu], sizes=({"as_expr": {"expr_str": "2*s0 + 1"}},))
    size = node("torch.ops.aten.sym_size.int", [("self", tensor_arg("x")), ("dim", {"as_int": 0})], ["s"])
    size["outputs"] = [{"as_sym_int": {"as_name": "s"}}]
    mul = node("_operator.mul", [("a", {"as_sym_int": {"as_name": "s"}}), ("b", {"as_int": 2})], ["m"])
    mul["outputs"] = [{"as_sym_int": {"as_name": "m"}}]
    yield "sym_mul.json", program([size, mul, relu])
    yield "add_scalar.json", program([node("torch.ops.aten.add.Tensor", [("self", tensor_arg("x")), ("other", {"as_float": 1.5})])])
    yield "used_before_made.json", program([node("torch.ops.aten.relu.default", [("self", tensor_arg("y"))])])
    yield "not_allowed.json", program([node("torch.ops.aten.save.default", [("self", tensor_arg("x"))])])
    yield "no_such_op.json", program([node("torch.ops.aten.nope.default", [("self", tensor_arg("x"))])])
    yield "wrong_type.json", program([node("torch.ops.aten.relu.default", [("self", {"as_int": 1})])])
    yield "nodes_not_list.json", b'{"graph_module":{"graph":{"nodes":5,"tensor_values":{}},"signature":{"input_specs":[]}}}'
    yield "deep.json", b"[" * 70 + b"]" * 70
    yield "not_json.json", b'{"graph_module":'
    region = {"as_graph": {"name": "g", "graph": {"inputs": [tensor_arg("a")], "outputs": [tensor_arg("r")],
                                                  "nodes": [node("torch.ops.aten.relu.default", [("self", tensor_arg("a"))], ["r"])]}}}
    yield "no_grad.json", program([node("torch.ops.higher_order.wrap_with_set_grad_enabled",
                                        [("", {"as_bool": False}), ("", region), ("", tensor_arg("x"))])])
    yield "cond.json", program([node("torch.ops.higher_order.cond",
                                     [("", {"as_bool": True}), ("", region), ("", region), ("", {"as_tensors": [tensor_arg("x")]})])])
    # The fixtures' programs, compacted; the smallest also as torch wrote it.
    files = pt2_files()
    for name, data in files:
        yield name + ".json", compact_program(program_record(data)[1])
    yield files[0][0] + ".raw.json", program_record(files[0][1])[1]


TARGETS = {
    "npy": npy_seeds,
    "safetensors": safetensors_seeds,
    "data_spec": data_spec_seeds,
    "data_source_spec": data_source_seeds,
    "pushed_batches": pushed_batches_seeds,
    "image": image_seeds,
    "auth_file": auth_file_seeds,
    "upload_header": upload_header_seeds,
    "model_ref": model_ref_seeds,
    "s3_xml": s3_xml_seeds,
    "read_request": read_request_seeds,
    "pt2_archive": pt2_archive_seeds,
    "program_plan": program_plan_seeds,
}


def main():
    global fixtures_dir
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="writes OUT/<target>/<seed>")
    parser.add_argument("--max-bytes", type=int, default=0, help="only seeds of at most this many bytes")
    parser.add_argument("--fixtures", default=fixtures_dir, help="the fixtures' exported programs (*.pt2)")
    parser.add_argument("targets", nargs="*", help="default: all")
    args = parser.parse_args()
    fixtures_dir = args.fixtures
    for target in args.targets or TARGETS:
        if target not in TARGETS:
            sys.exit(f"make_corpus: unknown target {target}; targets: {' '.join(TARGETS)}")
        folder = os.path.join(args.out, target)
        os.makedirs(folder, exist_ok=True)
        written = 0
        for name, data in TARGETS[target]():
            if args.max_bytes and len(data) > args.max_bytes:
                continue
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
            written += 1
        print(f"make_corpus: {written} seeds in {folder}")


if __name__ == "__main__":
    main()
