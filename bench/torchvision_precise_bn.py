#!/usr/bin/env -S sh -c 'exec "$(dirname "$0")/../.venv/bin/python" "$0" "$@"'
"""Precise BN over an image folder the way it is done in Python today: the Python side of
the image benchmarks.

    .venv/bin/python bench/torchvision_precise_bn.py (--model M.pt [--family resnet18] | --arch resnet18)
        --folder DIR --resize 256 --crop 224 --batch_size 32 --workers 2 --batches 20 --threads 2
        [--method fvcore|update_bn] [--out STATE.pt] [--json RESULT.json]

The job: torchvision.datasets.ImageFolder(DIR) with the eval transform (Resize(R),
CenterCrop(C), ToTensor, Normalize(ImageNet mean/std unless --mean/--std)), a
DataLoader(batch_size=B, shuffle=False, num_workers=W), and a precise-BN pass over the
first K batches (--batches 0: all) with torch.set_num_threads(T):
  --method fvcore     (default) fvcore.nn.precise_bn.update_bn_stats from the PyPI package
                      fvcore: every BN in train mode with momentum 1.0, per-batch stats
                      averaged with sample weights in float32 (E[x^2] - E[x]^2); the whole
                      model in train mode;
  --method update_bn  torch.optim.swa_utils.update_bn: BN momentum=None (cumulative average
                      of batch means and unbiased batch variances, every batch weighs the
                      same); the whole model in train mode.
A TorchScript archive (--model) cannot have its BN momentum set (a compiled constant), so,
as bench/python_baselines.py does, the eager model of tests/fixtures/models.py (--family) is
built and given the archive's state_dict. --arch builds torchvision.models.<arch>() instead
(random weights: no downloads here).

Timed (wall clock, after the files were read once so the page cache is warm unless
--cold):
  job:          ImageFolder + DataLoader creation (worker start-up included), every batch
                decoded, transformed, collated and fed through the precise-BN pass;
  decode only:  the same ImageFolder + DataLoader over the same batches, no model:
                images/s of the input pipeline alone (what the job cannot beat).
Prints one JSON object (also written to --json PATH).
"""

import argparse
import itertools
import json
import os
import sys
import time

T_START = time.time()

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "bench"))
sys.path.insert(0, os.path.join(_ROOT, "tests", "fixtures"))

import torch  # noqa: E402
import torchvision  # noqa: E402
import torchvision.transforms as T  # noqa: E402

import models  # noqa: E402

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _floats(text):
    vals = tuple(float(v) for v in text.split(","))
    if len(vals) != 3:
        raise argparse.ArgumentTypeError("want three comma-separated numbers")
    return vals


def make_loader(args):
    tf = T.Compose([T.Resize(args.resize), T.CenterCrop(args.crop), T.ToTensor(), T.Normalize(args.mean, args.std)])
    dataset = torchvision.datasets.ImageFolder(args.folder, transform=tf)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=False,
                                         num_workers=args.workers, drop_last=False)
    return dataset, loader


def images_only(loader, batches):
    """The loader's first `batches` image tensors (labels dropped); counts images seen."""
    seen = [0]

    def gen():
        it = iter(loader) if batches is None else itertools.islice(loader, batches)
        for x, _ in it:
            seen[0] += x.shape[0]
            yield x

    return gen(), seen


def build_model(args):
    if args.model:
        archive = torch.jit.load(args.model)
        model, _ = models.build(args.family)
        model.load_state_dict(archive.state_dict(), strict=True)  # identical weights and buffers
        return model, "eager %s with the state_dict of %s" % (args.family, os.path.basename(args.model))
    model = getattr(torchvision.models, args.arch)()
    return model, "torchvision.models.%s() (random weights)" % args.arch


def warm_page_cache(folder):
    total = 0
    for dirpath, _, names in os.walk(folder):
        for n in names:
            with open(os.path.join(dirpath, n), "rb") as f:
                while True:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    total += len(chunk)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="TorchScript archive (its weights; the eager --family model is run)")
    src.add_argument("--arch", help="a torchvision.models constructor name, e.g. resnet18")
    ap.add_argument("--family", default="resnet18", help="with --model: eager architecture from tests/fixtures/models.py")
    ap.add_argument("--folder", required=True, help="ImageFolder root (class subfolders)")
    ap.add_argument("--resize", type=int, default=256)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--mean", type=_floats, default=IMAGENET_MEAN)
    ap.add_argument("--std", type=_floats, default=IMAGENET_STD)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    ap.add_argument("--batches", type=int, default=0, help="batches to use (0: all)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in the main process")
    ap.add_argument("--method", choices=("fvcore", "update_bn"), default="fvcore")
    ap.add_argument("--no_decode_only", action="store_true", help="skip the decode-only pass")
    ap.add_argument("--cold", action="store_true", help="do not read the files once before timing")
    ap.add_argument("--out", help="torch.save the recalibrated state_dict here")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    bytes_read = 0 if args.cold else warm_page_cache(args.folder)
    t0 = time.perf_counter()
    model, described = build_model(args)
    model.train()
    load_s = time.perf_counter() - t0

    # ---- the job: data loading + precise BN.
    t0 = time.perf_counter()
    dataset, loader = make_loader(args)
    available = len(loader)
    batches = available if args.batches == 0 else args.batches
    if batches > available:
        raise SystemExit("torchvision_precise_bn: --batches %d but %s has %d images: %d batches of %d"
                         % (args.batches, args.folder, len(dataset), available, args.batch_size))
    gen, seen = images_only(loader, batches)
    if args.method == "fvcore":
        from fvcore.nn.precise_bn import get_bn_modules, update_bn_stats

        layers = len(get_bn_modules(model))
        update_bn_stats(model, gen, batches)
    else:
        from torch.optim.swa_utils import update_bn

        layers = sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
        update_bn(gen, model)  # resets the stats, momentum=None, one pass, restores momentum
    job_s = time.perf_counter() - t0
    job_images = seen[0]

    # ---- decode only: the same input pipeline, no model.
    decode_s = decode_images = None
    if not args.no_decode_only:
        t0 = time.perf_counter()
        _, loader2 = make_loader(args)
        gen2, seen2 = images_only(loader2, batches)
        for _ in gen2:
            pass
        decode_s = time.perf_counter() - t0
        decode_images = seen2[0]

    if args.out:
        tmp = args.out + ".tmp"
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, args.out)

    result = {
        "tool": "torchvision ImageFolder + DataLoader + %s" % ("fvcore precise_bn" if args.method == "fvcore"
                                                                 else "torch.optim.swa_utils.update_bn"),
        "model": described,
        "bn_layers": layers,
        "folder": os.path.abspath(args.folder),
        "images_in_folder": len(dataset),
        "resize": args.resize,
        "crop": args.crop,
        "batch_size": args.batch_size,
        "batches": batches,
        "images": job_images,
        "workers": args.workers,
        "threads": args.threads,
        "page_cache": "cold (not pre-read)" if args.cold else "warm (%.1f MB read once before timing)" % (bytes_read / 2 ** 20),
        "import_s": round(t0_import_s(), 3),
        "load_model_s": round(load_s, 3),
        "job_s": round(job_s, 3),
        "job_images_per_s": round(job_images / job_s, 2) if job_s > 0 else None,
        "decode_only_s": None if decode_s is None else round(decode_s, 3),
        "decode_only_images_per_s": None if decode_s is None else round(decode_images / decode_s, 2),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
    }
    text = json.dumps(result)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


_IMPORTED = time.time()


def t0_import_s():
    return _IMPORTED - T_START


if __name__ == "__main__":
    sys.exit(main())
