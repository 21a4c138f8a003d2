#!/usr/bin/env python3
"""recal-run on an image folder: BatchNorm statistics against the float64 reference fed
with torchvision's own tensors.

    .venv/bin/python tests/e2e/check_image_folder.py --bin build/bin/recal-run [--keep] [--png-edge-cases]

In a temp dir (about 10 s on 2 busy cores):
  1. writes a folder of 46 files with PIL: 43 good images of mixed sizes (60..200 px,
     portrait and landscape, some upsampled, some already at the resize size so that only
     decoding and cropping apply, some whose centre-crop offset is x.5 where Python rounds
     half to even), JPEG (baseline, progressive, optimised, 4:4:4 / 4:2:2 / 4:2:0, gray,
     Adobe CMYK, an EXIF orientation tag that neither side applies), PNG (RGB, RGBA, LA,
     L, 1-bit, palette, palette with transparency), upper-case extensions, nested folders
     whose names sort differently byte-wise ("a-b/" < "a/" < "a0/", "B/" < "b/") than
     directory by directory; bad files: a truncated JPEG, a truncated PNG and a text file
     named .jpg; files that are not read: .txt, .bmp;
  2. builds the batches torchvision gives (PIL open -> convert("RGB") -> Resize(R) ->
     CenterCrop(C) -> ToTensor -> Normalize), in sorted relative-path order, without the
     files PIL cannot load, and computes the float64 reference (tests/fixtures/reference.py)
     on resnet18 (tests/fixtures/models.py, scripted) with the same batching;
  3. checks recal-run ... --data images:DIR?...&on_bad=skip:
       - every layer's running_mean / running_var against the reference within the 1e-5
         of the other end-to-end checks: the pixels are torchvision's to the bit, so
         nothing looser is needed;
       - controls: real errors (one image left out, mean/std of two channels swapped, the
         files in directory-walk order, every pixel one level brighter) exceed that
         tolerance CONTROL_MARGIN times over, so the comparison cannot pass vacuously;
       - the engine alone: recal-run fed torchvision's tensors (npy:) meets the same 1e-5;
       - each image's pixels, through a probe model (see Probe) whose BatchNorm
         statistics are the images themselves: equal to torchvision's;
       - the report: samples == good images, batches, skipped_files;
       - --threads 1 --prefetch 0 --decode_threads 1 and --threads 2 --prefetch 3
         --decode_threads 4: bit-identical bn_out;
       - on_bad=fail (the default): a non-zero exit whose reason names the first bad file,
         and no output files.
--png-edge-cases (ctest passes it) adds PNGs where a generic decoder would disagree with PIL
(a gAMA chunk of 1.0, 16-bit RGB, 16-bit gray): PIL ignores gAMA, keeps the high byte of
16-bit RGB and clips 16-bit gray ("I" mode) at 255; the pixel probe names any mismatch.
"""

import argparse
import copy
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "tests", "fixtures"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from PIL import Image  # noqa: E402

import models  # noqa: E402
import reference  # noqa: E402
import safetensors_io  # noqa: E402

RESIZE, CROP = 72, 64
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 12  # 43 good images: 3 full batches and a partial one of 7
EXTENSIONS = (".jpg", ".jpeg", ".png")

# ---- Tolerance. The images reach the model bit-identical to torchvision's tensors
# (pil_resample.cc reproduces Pillow's resampling), so the statistics meet the engine's own
# tolerance. For scale, measured on this folder with resnet18 (worst relative error):
#   recal-run fed torchvision's own tensors (npy:)           1.1e-6
#   the float two-pass resampler recal-run had before (up to 2/255 off, -0.03 levels on
#   average)                                                  1.6e-2 (layer4; 4e-4 in bn1)
#   every pixel one level brighter / one image of 43 left out / directory-walk order /
#   mean and std of channels 0 and 2 swapped                  well above 1e-3
# Controls must exceed the tolerance CONTROL_MARGIN times.
CONTROL_MARGIN = 5.0
ENGINE_RTOL = models.DEFAULT_RTOL


# --------------------------------------------------------------------------- the folder


def _content(rng, h, w, c=3):
    """Natural-looking uint8 content: smooth gradients, a few discs, noise."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, c), np.float32)
    for k in range(c):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., k] = 128 + 90 * np.sin(a * x / w * 4 + b * y / h * 4 + p * 3)
    for _ in range(rng.integers(2, 5)):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        r = rng.uniform(0.1, 0.4) * min(h, w)
        img[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.uniform(0, 255, c)
    img += rng.normal(0, 12, img.shape)
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


def _png_chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def _write_png(path, arr, bit_depth, color_type, extra=b""):
    """A PNG written by hand, for what PIL does not write (16-bit RGB, gAMA)."""
    h, w = arr.shape[:2]
    dt = ">u2" if bit_depth == 16 else "u1"
    raw = b"".join(b"\x00" + np.ascontiguousarray(arr[y]).astype(dt).tobytes() for y in range(h))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0))
                + extra + _png_chunk(b"IDAT", zlib.compress(raw)) + _png_chunk(b"IEND", b""))


def make_folder(root, seed=0, png_edge_cases=False):
    """Writes the test folder; returns {relative path: how it was made}."""
    rng = np.random.default_rng(seed)
    made = {}

    def save(rel, img, **kw):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fmt = {".png": "PNG", ".bmp": "BMP"}.get(os.path.splitext(rel)[1].lower(), "JPEG")
        img.save(path, fmt, **kw)
        made[rel] = "%s %s %dx%d %s" % (fmt, img.mode, img.size[0], img.size[1],
                                         " ".join("%s=%s" % kv for kv in sorted(kw.items()) if kv[0] != "exif"))

    def rgb(h, w):
        return Image.fromarray(_content(rng, h, w))

    # RGB JPEGs of many sizes (h, w) and encoder settings, in class folders. 72 on the short
    # side: no resize; 113 / 157 -> 113 on the long side: crop offset 24.5, rounded to 24.
    sizes = [(60, 80), (80, 60), (64, 64), (72, 72), (72, 113), (113, 72), (100, 157), (90, 142), (200, 61),
             (61, 200), (150, 150), (120, 180), (180, 120), (97, 150), (71, 200), (199, 133), (128, 96),
             (96, 128), (140, 77), (77, 140), (160, 107), (65, 65), (110, 190), (190, 110)]
    for i, (h, w) in enumerate(sizes):
        kw = dict(quality=int(rng.integers(70, 96)), subsampling=[0, 1, 2][i % 3])
        if i % 4 == 1:
            kw["progressive"] = True
        if i % 5 == 2:
            kw["optimize"] = True
        ext = ".JPG" if i % 7 == 3 else (".jpeg" if i % 7 == 5 else ".jpg")
        save("class_%d/img_%02d%s" % (i % 3, i, ext), rgb(h, w), **kw)
    save("class_0/gray.jpg", Image.fromarray(_content(rng, 100, 130, 1)[..., 0], "L"), quality=90)
    save("class_1/gray_prog.jpeg", Image.fromarray(_content(rng, 140, 90, 1)[..., 0], "L"), quality=85,
         progressive=True)
    save("class_2/cmyk.jpg", Image.fromarray(_content(rng, 120, 150, 4), "CMYK"), quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation "rotate 90 CW": ImageFolder + PIL do not apply it
    save("class_2/exif_rot.jpg", rgb(90, 160), quality=88, exif=exif.tobytes())
    save("png/rgb.png", rgb(110, 80))
    save("png/rgba.png", Image.fromarray(_content(rng, 90, 120, 4), "RGBA"))
    save("png/la.png", Image.fromarray(_content(rng, 100, 100, 2), "LA"))
    save("png/gray.PNG", Image.fromarray(_content(rng, 85, 130, 1)[..., 0], "L"))
    save("png/bw.png", Image.fromarray(_content(rng, 96, 96, 1)[..., 0] > 128))
    save("png/palette.png", rgb(80, 100).convert("P", palette=Image.ADAPTIVE, colors=64))
    save("png/palette_trns.png", rgb(120, 70).convert("P", palette=Image.ADAPTIVE, colors=32), transparency=3)
    save("nested/a/deep/er/x.jpg", rgb(150, 100), quality=92)
    save("nested/a/y.png", rgb(70, 90))
    save("nested/a-b/z.jpg", rgb(100, 140), quality=80)
    save("nested/a0/w.jpg", rgb(130, 130), quality=90, subsampling=0)
    save("nested/B/v.jpg", rgb(66, 99), quality=95)
    save("nested/b/u.jpeg", rgb(99, 66), quality=75)
    save("top.jpg", rgb(75, 75), quality=90)
    save("Top.png", rgb(64, 150))
    # Bad files, and files that are not read.
    b = io.BytesIO()
    rgb(120, 160).save(b, "JPEG", quality=90)
    with open(os.path.join(root, "class_1/bad_truncated.jpg"), "wb") as f:
        f.write(b.getvalue()[: len(b.getvalue()) // 2])
    made["class_1/bad_truncated.jpg"] = "JPEG truncated to half"
    b = io.BytesIO()
    rgb(100, 100).save(b, "PNG")
    with open(os.path.join(root, "png/bad_truncated.png"), "wb") as f:
        f.write(b.getvalue()[: len(b.getvalue()) * 2 // 3])
    made["png/bad_truncated.png"] = "PNG truncated to two thirds"
    with open(os.path.join(root, "nested/a/not_an_image.jpg"), "w") as f:
        f.write("this is text, not a JPEG\n")
    made["nested/a/not_an_image.jpg"] = "text file"
    with open(os.path.join(root, "notes.txt"), "w") as f:
        f.write("not read\n")
    save("class_0/ignored.bmp", rgb(70, 70))
    if png_edge_cases:
        os.makedirs(os.path.join(root, "png_edge"), exist_ok=True)
        base = _content(rng, 72, 90)
        _write_png(os.path.join(root, "png_edge/gamma_1.0.png"), base, 8, 2,
                   _png_chunk(b"gAMA", struct.pack(">I", 100000)))
        made["png_edge/gamma_1.0.png"] = "PNG RGB 8-bit with gAMA 1.0"
        _write_png(os.path.join(root, "png_edge/rgb16.png"),
                   base.astype(np.uint16) * 257 + rng.integers(0, 256, base.shape).astype(np.uint16), 16, 2)
        made["png_edge/rgb16.png"] = "PNG RGB 16-bit, no gAMA"
        _write_png(os.path.join(root, "png_edge/gray16.png"), base[..., 0].astype(np.uint16) * 257, 16, 0)
        made["png_edge/gray16.png"] = "PNG gray 16-bit (PIL mode I)"
    return made


def list_images(root):
    """Every .jpg/.jpeg/.png (any case) under root, by byte-wise relative path."""
    rels = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            if os.path.splitext(n)[1].lower() in EXTENSIONS:
                rels.append(os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/"))
    return sorted(rels, key=lambda s: s.encode("utf-8"))


def torchvision_crops(root, rels):
    """{rel: PIL image after Resize(R) + CenterCrop(C)}, None where PIL cannot load it."""
    import torchvision.transforms as T

    tf = T.Compose([T.Resize(RESIZE), T.CenterCrop(CROP)])
    out = {}
    for rel in rels:
        try:
            with open(os.path.join(root, rel), "rb") as f:
                img = Image.open(f).convert("RGB")
        except Exception:  # noqa: BLE001  (PIL's errors for truncated files / non-images vary)
            out[rel] = None
            continue
        out[rel] = tf(img)
    return out


def to_tensor(img, mean=MEAN, std=STD):
    """ToTensor + Normalize of a PIL image or an HxWx3 uint8 array, as torchvision does it."""
    import torchvision.transforms as T

    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    return T.Normalize(mean, std)(T.ToTensor()(img))


def batches_of(tensors, batch_size=BATCH):
    x = torch.stack(tensors)
    return [(x[i : i + batch_size],) for i in range(0, x.shape[0], batch_size)]


# --------------------------------------------------------------------------- metrics


def layer_errors(got, ref):
    """{mean key: (mean error, var error)}, relative, in the metric of reference.stats_close."""
    out = {}
    for mk in ref:
        if mk.endswith("running_mean"):
            vk = mk[: -len("mean")] + "var"
            if mk not in got or vk not in got:
                out[mk] = (float("inf"), float("inf"))
                continue
            _, em, ev = reference.stats_close(got, ref, mk, vk, rtol=1.0)
            out[mk] = (em if np.isfinite(em) else float("inf"), ev if np.isfinite(ev) else float("inf"))
    return out


def worst(got, ref):
    """(worst relative error, statistic's key) over every layer's mean and variance."""
    out = []
    for mk, (em, ev) in layer_errors(got, ref).items():
        out += [(em, mk), (ev, mk[: -len("mean")] + "var")]
    return max(out)


# --------------------------------------------------------------------------- pixel probe


class Probe(nn.Module):
    """The k-th forward pass (one image, batch_size 1) goes through bns[k] only, as a batch
    of two copies of the image flattened to features: that BatchNorm1d's population mean is
    the image's normalised pixels. Relies on recal-run running forward once per batch."""

    def __init__(self, n, features):
        super().__init__()
        self.bns = nn.ModuleList([nn.BatchNorm1d(features) for _ in range(n)])
        self.register_buffer("calls", torch.zeros(1, dtype=torch.long))

    def forward(self, x):
        i = int(self.calls.item())
        self.calls += 1
        y = torch.cat([x, x], 0).reshape(2 * x.shape[0], -1)
        j = 0
        for bn in self.bns:
            if j == i:
                y = bn(y)
            j += 1
        return y


# --------------------------------------------------------------------------- running


def run(binary, args, timeout=300):
    t0 = time.time()
    p = subprocess.run([binary] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                       timeout=timeout)
    return p.returncode, p.stderr.decode("utf-8", "replace"), time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="path to recal-run")
    ap.add_argument("--fixtures", help="unused (the model is built here)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--png-edge-cases", action="store_true",
                    help="add PNGs with gAMA 1.0 / 16-bit samples, which PIL reads in its own way")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        print("check_image_folder: %s is not an executable file" % binary, file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    t_start = time.time()
    work = tempfile.mkdtemp(prefix="recal-images-")
    failures = []

    def check(ok, what):
        print("%s %s" % ("ok  " if ok else "FAIL", what), flush=True)
        if not ok:
            failures.append(what)
        return ok

    try:
        root = os.path.join(work, "imgs")
        made = make_folder(root, png_edge_cases=args.png_edge_cases)
        rels = list_images(root)
        crops = torchvision_crops(root, rels)
        good = [r for r in rels if crops[r] is not None]
        bad = [r for r in rels if crops[r] is None]
        tv = {r: to_tensor(crops[r]) for r in good}
        print("folder: %d image files (%d good; bad: %s), resize %d crop %d, batch %d  (%.1fs)"
              % (len(rels), len(good), ", ".join(bad), RESIZE, CROP, BATCH, time.time() - t_start), flush=True)
        check(sorted(bad) == sorted(r for r in made if "truncated" in r or "not_an_image" in r),
              "PIL refuses exactly the three bad files")

        eager, _ = models.build("resnet18")
        model_path = os.path.join(work, "resnet18.pt")
        torch.jit.save(torch.jit.script(copy.deepcopy(eager)), model_path)

        def ref_of(tensors):
            return reference.reference_all(copy.deepcopy(eager), batches_of(tensors), "resnet18")[0]["population"]

        ref = ref_of([tv[r] for r in good])
        spec = "images:%s?resize=%d&crop=%d&mean=%s&std=%s" % (
            root, RESIZE, CROP, ",".join(map(str, MEAN)), ",".join(map(str, STD)))

        def recal(tag, data, extra=(), model=model_path, batch_size=BATCH):
            d = os.path.join(work, tag)
            os.makedirs(d)
            outs = dict(out=os.path.join(d, "out.pt"), bn=os.path.join(d, "bn.safetensors"),
                        report=os.path.join(d, "report.json"))
            rc, err, secs = run(binary, ["--model", model, "--data", data, "--batch_size", str(batch_size),
                                         "--out", outs["out"], "--bn_out", outs["bn"], "--report", outs["report"]]
                                + list(extra))
            if rc != 0:
                lines = [l for l in err.splitlines() if l.strip()]
                outs["reason"] = lines[-1] if lines else "(no stderr)"
            return rc, err, secs, outs

        # ---- the main comparison.
        rc, err, secs, outs = recal("skip", spec + "&on_bad=skip",
                                    ["--threads", "1", "--prefetch", "0", "--decode_threads", "1"])
        if not check(rc == 0, "recal-run images:...&on_bad=skip exits 0 (exit %d%s)"
                     % (rc, "" if rc == 0 else ": " + outs["reason"])):
            return 1
        e, key = worst(safetensors_io.load(outs["bn"]), ref)
        check(e <= ENGINE_RTOL, "recal-run on images vs reference on torchvision's tensors: worst relative "
              "error %.2e (%s) <= %.0e  (%.1fs)" % (e, key, ENGINE_RTOL, secs))

        with open(outs["report"]) as f:
            rep = json.load(f)
        samples, batches = int(rep.get("samples", -1)), int(rep.get("batches", -1))
        want_batches = (len(good) + BATCH - 1) // BATCH
        check(samples == len(good) and batches == want_batches,
              "report: samples %d (want %d good images), batches %d (want %d)"
              % (samples, len(good), batches, want_batches))
        sk = rep.get("skipped_files", rep.get("skippedFiles", 0))
        check(int(sk) == len(bad), "report: skipped_files %s (want %d)" % (sk, len(bad)))

        # ---- controls: real errors the tolerance must reject.
        controls = []
        drop = good[len(good) // 2]
        controls.append(("one image (%s) left out" % drop, ref_of([tv[r] for r in good if r != drop])))
        sw = (2, 1, 0)
        controls.append(("mean/std of channels 0 and 2 swapped",
                         ref_of([to_tensor(crops[r], [MEAN[i] for i in sw], [STD[i] for i in sw]) for r in good])))
        walk = []  # directory by directory, names and subdirectories sorted
        for dirpath, dirs, names in os.walk(root):
            dirs.sort()
            walk += [os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/") for n in sorted(names)]
        walk = [r for r in walk if r in tv]
        if walk != good:
            controls.append(("directory-walk order instead of byte-wise", ref_of([tv[r] for r in walk])))
        controls.append(("every pixel one level brighter", ref_of(
            [to_tensor(np.clip(np.asarray(crops[r]).astype(np.int16) + 1, 0, 255).astype(np.uint8)) for r in good])))
        for what, wrong in controls:
            e, key = worst(wrong, ref)
            check(e >= CONTROL_MARGIN * ENGINE_RTOL, "control rejected: %s: %.1e (%s) >= %g x tolerance"
                  % (what, e, key, CONTROL_MARGIN))

        # ---- the engine alone: torchvision's tensors as npy meet the agreed tolerance.
        npy = os.path.join(work, "torchvision.npy")
        np.save(npy, torch.stack([tv[r] for r in good]).numpy())
        rc, err, secs, o = recal("npy", "npy:" + npy, ["--threads", "1"])
        if check(rc == 0, "recal-run npy: exits 0 (exit %d%s)" % (rc, "" if rc == 0 else ": " + o["reason"])):
            e, _ = worst(safetensors_io.load(o["bn"]), ref)
            check(e <= ENGINE_RTOL, "recal-run on torchvision's tensors (npy:) vs reference: worst relative error "
                  "%.2e <= %.0e  (%.1fs)" % (e, ENGINE_RTOL, secs))

        # ---- pixels, image by image.
        probe_path = os.path.join(work, "probe.pt")
        torch.jit.save(torch.jit.script(Probe(len(good), 3 * CROP * CROP).eval()), probe_path)
        rc, err, secs, o = recal("probe", spec + "&on_bad=skip", ["--threads", "1"], model=probe_path, batch_size=1)
        if check(rc == 0, "recal-run with the pixel probe exits 0 (exit %d%s)"
                 % (rc, "" if rc == 0 else ": " + o["reason"])):
            px = safetensors_io.load(o["bn"])
            std = torch.tensor(STD, dtype=torch.float64).view(3, 1, 1)
            over, biases = [], []
            for i, r in enumerate(good):
                d = (px["bns.%d.running_mean" % i].double().view(3, CROP, CROP) - tv[r].double()) * std * 255
                biases.append(d.mean().item())
                if d.abs().max().item() > 1e-3:
                    over.append("%s [%s]: max %.0f/255, %.1f%% of values differ, mean %+.3f"
                                % (r, made.get(r, "?"), d.abs().max().item(), 100 * (d.abs() > 0.5).double().mean().item(),
                                   d.mean().item()))
            check(not over, "pixels equal to torchvision's in every image (mean difference over all "
                  "images %+.4f levels)%s" % (float(np.mean(biases)), "".join("\n       - " + s for s in over)))

        # ---- determinism across --threads / --prefetch.
        rc, err, secs, o = recal("threads2", spec + "&on_bad=skip",
                                 ["--threads", "2", "--prefetch", "3", "--decode_threads", "4"])
        if check(rc == 0, "recal-run --threads 2 --prefetch 3 --decode_threads 4 exits 0 (exit %d)" % rc):
            with open(outs["bn"], "rb") as f1, open(o["bn"], "rb") as f2:
                same = f1.read() == f2.read()
            check(same, "1 and 4 decoding threads, prefetch 0 and 3, 1 and 2 intra-op threads give bit-identical "
                  "bn_out  (%.1fs)"
                  % secs)

        # ---- on_bad=fail (the default): fails naming the first bad file, leaves nothing.
        rc, err, secs, o = recal("fail", spec, ["--threads", "1"])
        reason = o.get("reason", "")
        check(rc > 0 and bad[0] in reason and reason.startswith("recal-run: "),
              "on_bad=fail: exit %d, the reason names %s: %r" % (rc, bad[0], reason[-150:]))
        check(not any(os.path.exists(o[k]) for k in ("out", "bn", "report")), "on_bad=fail leaves no output files")
    finally:
        if args.keep or failures:
            print("work directory kept: %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("%s (%.0fs)" % ("passed" if not failures else "%d FAILED" % len(failures), time.time() - t_start))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
