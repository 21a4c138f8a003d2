#!/usr/bin/env -S sh -c 'exec "$(dirname "$0")/../.venv/bin/python" "$0" "$@"'
"""The Python side of bench/baselines_compare.py: one whole process that recalibrates the
BatchNorm statistics the way Python users do today, with the libraries' own functions.

    .venv/bin/python bench/python_baselines.py --method fvcore|update_bn --family resnet18
        --weights STATE.pt --data npy:DATA.npy --batch_size 32 --batches 20 --threads 2
        --out NEW_STATE.pt

  --method fvcore     fvcore.nn.precise_bn.update_bn_stats(model, loader, num_iters) from the
                      PyPI package fvcore, as its docstring says to call it: the model in
                      train mode (every BN momentum 1.0, per-batch statistics weighted by
                      their element counts, accumulated in the buffers' float32 as
                      E[x^2] - E[x]^2);
  --method update_bn  torch.optim.swa_utils.update_bn(loader, model): BN momentum None, a
                      cumulative average in which every batch weighs the same (unbiased
                      batch variances); it puts the model in train mode itself.

The model is the eager one (build_eager) given the weights the comparison saved from the
same module it scripted into recal-run's archive; the loader yields a fresh float32 tensor
per batch read from the .npy, as a DataLoader would. torch.set_num_threads(--threads).
The new state_dict goes to --out; one JSON line on stdout gives the phases' seconds.
"""

import argparse
import json
import os
import sys
import time

T_START = time.time()

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tests", "fixtures"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import models  # noqa: E402

# Families the benchmark builds beyond tests/fixtures/models.py's (whose FAMILIES the test
# suite owns).
BENCH_ONLY_FAMILIES = ("resnet50",)


def build_eager(family):
    """The eager model of `family` in eval mode, seeded: tests/fixtures/models.py's, or, for
    resnet50, torchvision's ResNet-50 (10 classes) given non-trivial old BN statistics and
    affine parameters the same way models.py gives its families."""
    if family not in BENCH_ONLY_FAMILIES:
        return models.build(family)[0]
    import torchvision

    seed = models.family_seed(family)
    torch.manual_seed(seed)
    model = torchvision.models.resnet50(num_classes=10)
    models._set_old_stats(model, family, seed)
    return model.eval()


def npy_batches(path, batch_size, batches):
    """The first `batches` batches of the .npy, each a fresh tensor, as a loader gives."""
    arr = np.load(path, mmap_mode="r")
    for start in range(0, min(arr.shape[0], batches * batch_size), batch_size):
        yield torch.from_numpy(np.array(arr[start : start + batch_size]))


def recalibrate(method, model, loader, batches):
    """Runs the library's own function on the model; returns the library's version."""
    if method == "fvcore":
        import fvcore
        from fvcore.nn.precise_bn import update_bn_stats

        model.train()  # fvcore leaves the mode to the caller
        update_bn_stats(model, loader, num_iters=batches)
        return "fvcore " + getattr(fvcore, "__version__", "?")
    from torch.optim.swa_utils import update_bn

    update_bn(loader, model)
    return "torch " + torch.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", choices=("fvcore", "update_bn"), required=True)
    ap.add_argument("--family", required=True, help="architecture (build_eager)")
    ap.add_argument("--weights", required=True, help="torch.save'd state_dict to load")
    ap.add_argument("--data", required=True, help="npy:PATH (float32, N x C x H x W)")
    ap.add_argument("--batch_size", type=int, required=True)
    ap.add_argument("--batches", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True, help="where to torch.save the new state_dict")
    args = ap.parse_args()
    if not args.data.startswith("npy:"):
        raise SystemExit("python_baselines: only npy: data is supported")
    torch.set_num_threads(args.threads)

    t0 = time.time()
    model = build_eager(args.family)
    model.load_state_dict(torch.load(args.weights, weights_only=True), strict=True)
    t1 = time.time()
    version = recalibrate(args.method, model, npy_batches(args.data[4:], args.batch_size, args.batches),
                          args.batches)
    t2 = time.time()
    torch.save(model.state_dict(), args.out)
    t3 = time.time()
    print(json.dumps({"library": version, "import_s": round(t0 - T_START, 3), "load_s": round(t1 - t0, 3),
                      "compute_s": round(t2 - t1, 3), "save_s": round(t3 - t2, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
