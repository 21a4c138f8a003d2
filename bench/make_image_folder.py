#!/usr/bin/env -S sh -c 'exec "$(dirname "$0")/../.venv/bin/python" "$0" "$@"'
"""Writes an ImageFolder-style data set of natural-looking JPEGs for the image benchmarks.

    .venv/bin/python bench/make_image_folder.py --out DIR --count N [--width 500 --height 375]
        [--quality 90] [--classes 10] [--seed 0] [--jobs 2]

DIR/class_00/000000.jpg, DIR/class_01/000001.jpg, ...: image i goes to class i % classes,
so ImageFolder's order (classes sorted, then files) equals the byte-wise sorted relative
paths that images: specs read. Every image is a random scene: a smooth low-frequency
background, a few shaded discs/boxes with soft edges, mid-frequency texture and sensor
noise, so that JPEG sizes and decode times are like photographs' (50-75 KB, mean ~62 KB,
at quality 90 for 500x375, against ~10 KB for a flat or purely smooth image). About 60 ms
an image on one core. Deterministic for a given seed, whatever --jobs.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
from PIL import Image


def _upsampled_noise(rng, h, w, gh, gw, channels):
    """Gaussian noise on a gh x gw grid, bicubically upsampled to h x w (per channel)."""
    out = np.empty((h, w, channels), np.float32)
    for c in range(channels):
        grid = rng.standard_normal((gh, gw)).astype(np.float32)
        out[..., c] = np.asarray(Image.fromarray(grid, "F").resize((w, h), Image.BICUBIC))
    return out


def scene(seed, width, height):
    """One natural-looking uint8 HxWx3 image."""
    rng = np.random.default_rng(seed)
    h, w = height, width
    # Colour palette of the scene: a base colour and a colour-mixing matrix so channels are
    # correlated like in photographs.
    base = rng.uniform(60, 190, 3).astype(np.float32)
    mix = (np.eye(3) * 0.6 + rng.uniform(0.0, 0.4, (3, 3))).astype(np.float32)
    img = base + 45.0 * _upsampled_noise(rng, h, w, 4, 5, 3) @ mix.T  # large smooth regions
    # A vertical gradient (sky/ground-like lighting).
    y = np.linspace(-1, 1, h, dtype=np.float32)[:, None, None]
    img += y * rng.uniform(-40, 40, 3).astype(np.float32)
    # Objects: soft-edged shaded discs and boxes.
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    for _ in range(rng.integers(3, 8)):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(0.05, 0.3) * h, rng.uniform(0.05, 0.3) * w
        if rng.random() < 0.5:
            d = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2
        else:
            d = np.maximum(np.abs(yy - cy) / ry, np.abs(xx - cx) / rx) ** 2
        alpha = np.clip((1.0 - d) * rng.uniform(3, 12), 0, 1)[..., None]
        colour = rng.uniform(0, 255, 3).astype(np.float32)
        shade = 1.0 + 0.3 * ((yy - cy) / ry)[..., None] * rng.uniform(-1, 1)
        img = img * (1 - alpha) + alpha * colour * shade
    # Mid-frequency texture over everything, stronger in some regions than others.
    detail = rng.uniform(0.7, 1.8)  # how busy the scene is: JPEG sizes vary like photos'
    strength = detail * (8.0 + 14.0 * np.abs(_upsampled_noise(rng, h, w, 3, 4, 1)))
    img += strength * (_upsampled_noise(rng, h, w, h // 6, w // 6, 3) @ mix.T)
    # Fine detail and sensor noise.
    img += _upsampled_noise(rng, h, w, h // 2, w // 2, 1) * (9.0 * detail)
    img += rng.normal(0, 4.0, img.shape).astype(np.float32)
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


def write_one(args_tuple):
    out, i, classes, width, height, quality, seed = args_tuple
    rel = "class_%02d/%06d.jpg" % (i % classes, i)
    path = os.path.join(out, rel)
    Image.fromarray(scene(seed * 1_000_003 + i, width, height)).save(path, "JPEG", quality=quality)
    return os.path.getsize(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory to write (created; existing files are overwritten)")
    ap.add_argument("--count", type=int, required=True, help="number of images")
    ap.add_argument("--width", type=int, default=500)
    ap.add_argument("--height", type=int, default=375)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="processes")
    args = ap.parse_args()
    if args.count < 1 or args.classes < 1 or args.width < 8 or args.height < 8:
        ap.error("--count and --classes must be >= 1, --width/--height >= 8")
    t0 = time.time()
    for c in range(min(args.classes, args.count)):
        os.makedirs(os.path.join(args.out, "class_%02d" % c), exist_ok=True)
    work = [(args.out, i, args.classes, args.width, args.height, args.quality, args.seed) for i in range(args.count)]
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.Pool(args.jobs) as pool:
            sizes = pool.map(write_one, work, chunksize=8)
    else:
        sizes = [write_one(w) for w in work]
    secs = time.time() - t0
    print(json.dumps({
        "out": os.path.abspath(args.out),
        "images": args.count,
        "classes": min(args.classes, args.count),
        "size": [args.width, args.height],
        "quality": args.quality,
        "mean_kb": round(sum(sizes) / len(sizes) / 1024, 1),
        "min_kb": round(min(sizes) / 1024, 1),
        "max_kb": round(max(sizes) / 1024, 1),
        "total_mb": round(sum(sizes) / 2 ** 20, 2),
        "seconds": round(secs, 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
