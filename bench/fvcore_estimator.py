#!/usr/bin/python3
"""The fvcore baseline for bench/fvcore_compare.py: a re-implementation, written from the
algorithm, of fvcore.nn.precise_bn.update_bn_stats (the version with
_PopulationVarianceEstimator), run on Debian's torch as one whole process.

    /usr/bin/python3 bench/fvcore_estimator.py --model M.pt --family resnet18 \
        --data npy:DATA.npy --batch_size 32 --batches 20 --threads 2 --out STATE.pt

What fvcore does, and so this does:
  - the whole model in train mode (fvcore leaves the mode to the caller, who puts the model
    in train mode; dropout etc. stay in train mode too);
  - every BatchNorm module in training mode gets momentum = 1.0, so after a forward its
    running_mean is the batch mean and running_var the unbiased batch variance;
  - a forward pre-hook records each BN's element count n = numel / C (and asserts a layer
    is not called twice per forward);
  - per batch, an estimator per layer keeps, in the buffers' dtype (float32), the running
    mean of batch means and of batch E[x^2] = mean^2 + var * (n - 1) / n, weighted by n;
    at the end var = E[x^2] - mean^2;
  - it asserts the loader gave exactly the requested number of batches;
  - layers that never ran get the estimator's initial zeros.

The model: fvcore needs eager BatchNorm modules whose `momentum` it can set. In a
TorchScript module `momentum` is a compiled constant (setting it raises "Can't set
constant 'momentum'"), so the eager model of tests/fixtures/models.py is built and given
the TorchScript archive's state_dict (identical weights and buffers).
"""

import argparse
import itertools
import json
import os
import sys
import time

T_START = time.time()

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tests", "fixtures"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import models  # noqa: E402

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


class WeightedSquareMeanEstimator:
    """Population mean/variance from per-batch (mean, unbiased var, n), fvcore-style:
    incremental weighted means of the batch means and batch second moments, in the
    buffers' own dtype."""

    def __init__(self, like_mean, like_var):
        self.mean = torch.zeros_like(like_mean)
        self.second = torch.zeros_like(like_var)
        self.count = 0

    def add(self, batch_mean, batch_unbiased_var, n):
        self.count += n
        w = n / self.count
        second = batch_mean * batch_mean + batch_unbiased_var * ((n - 1) / n)
        self.mean += (batch_mean - self.mean) * w
        self.second += (second - self.second) * w

    def variance(self):
        return self.second - self.mean * self.mean


@torch.no_grad()
def precise_bn(model, batches, num_iters):
    layers = [m for m in model.modules() if isinstance(m, _BN) and m.training]
    if not layers:
        return 0
    saved_momentum = [m.momentum for m in layers]
    for m in layers:
        m.momentum = 1.0
    seen = {}

    def pre_hook(module, inputs):
        if module in seen:
            raise AssertionError("a BatchNorm layer ran twice in one forward")
        x = inputs[0]
        seen[module] = x.numel() // x.shape[1]

    handles = [m.register_forward_pre_hook(pre_hook) for m in layers]
    est = [WeightedSquareMeanEstimator(m.running_mean, m.running_var) for m in layers]
    done = 0
    for inputs in itertools.islice(batches, num_iters):
        seen.clear()
        model(inputs)
        done += 1
        for m, e in zip(layers, est):
            n = seen.get(m)
            if n is not None:
                e.add(m.running_mean, m.running_var, n)
    if done != num_iters:
        raise AssertionError("asked for %d iterations, the data ran out after %d" % (num_iters, done))
    for m, e, mom in zip(layers, est, saved_momentum):
        m.running_mean = e.mean
        m.running_var = e.variance()
        m.momentum = mom
    for h in handles:
        h.remove()
    return len(layers)


def npy_batches(path, batch_size):
    arr = np.load(path, mmap_mode="r")
    for start in range(0, arr.shape[0], batch_size):
        yield torch.from_numpy(np.array(arr[start : start + batch_size]))  # a fresh batch, as a loader gives


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="TorchScript archive (its weights are used)")
    ap.add_argument("--family", default="resnet18", help="eager architecture from tests/fixtures/models.py")
    ap.add_argument("--data", required=True, help="npy:PATH")
    ap.add_argument("--batch_size", type=int, required=True)
    ap.add_argument("--batches", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True, help="torch.save'd state_dict with the new statistics")
    args = ap.parse_args()
    if not args.data.startswith("npy:"):
        raise SystemExit("fvcore_estimator: only npy: data is supported")
    torch.set_num_threads(args.threads)

    t0 = time.time()
    archive = torch.jit.load(args.model)
    state = archive.state_dict()
    model, _ = models.build(args.family)
    model.load_state_dict(state, strict=True)  # identical weights and buffers
    model.train()
    t1 = time.time()
    layers = precise_bn(model, npy_batches(args.data[4:], args.batch_size), args.batches)
    t2 = time.time()
    tmp = args.out + ".tmp"
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, args.out)
    t3 = time.time()
    print(json.dumps({
        "model": "eager %s with the archive's state_dict" % args.family,
        "bn_layers": layers,
        "import_s": round(t0 - T_START, 3),
        "load_s": round(t1 - t0, 3),
        "compute_s": round(t2 - t1, 3),
        "save_s": round(t3 - t2, 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
