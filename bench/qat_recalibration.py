#!/usr/bin/env -S sh -c 'exec "$(dirname "$0")/../.venv/bin/python" "$0" "$@"'
"""What re-estimating BatchNorm buys a quantization-aware model, as users will judge it:
test accuracy of a small ResNet at 8-bit activations / 4-bit weights, before and after
BatchNorm re-estimation by Recal, by fvcore's update_bn_stats and by AIMET-style per-batch
averaging, with the time each took.

    .venv/bin/python bench/qat_recalibration.py [--bin build/bin/recal-run] [--threads 2]
        [--seed 0] [--epochs 4] [--weight_bits 4] [--per_tensor] [--keep DIR]

The task (`shapes10`) is generated, not downloaded: 32x32 images of ten shapes (disk, square,
ring, frame, two bars, two diagonals, plus, cross) at random positions, sizes, intensities,
on a random gradient with noise; 6,000 for training, 2,000 for the test, 512 more for
calibration. A ResNet-8 (three stages of one basic block, 16-32-64 channels, 78k parameters)
trains in float32 for --epochs epochs on the CPU, then is made quantization-aware with
torch.ao's prepare_qat_fx: FusedMovingAvgObsFakeQuantize everywhere, activations uint8,
weights int4 per channel (symmetric, -8..7), Conv-BN pairs as QAT ConvBn modules. Two
starting points, each a row group of the table:

  init   quantization initialisation alone (NNCF's setting): the quantizers' observers run
         on the calibration batches with the model in eval mode, then are frozen. BatchNorm
         still holds the float model's statistics, which the 4-bit weights no longer give.
  qat    then one epoch of quantization-aware fine-tuning (lr 0.01, BatchNorm in train mode,
         its running statistics the exponential average of that epoch), observers frozen
         after it (AIMET's setting: re-estimation after QAT).

Each method starts from a copy of that model with its quantizers frozen and uses the same
512 calibration samples in 8 batches of 64:
  stored      the statistics the model holds (no re-estimation);
  recal-run   the model exported with torch.export (its fused quantizers in the program), run
              through build/bin/recal-run (population estimator, float64), its BatchNorm
              buffers loaded back; --iterations 2 too (the QAT ConvBn scales its weight by the
              running variance, so a second pass starts from better statistics);
  fvcore      fvcore.nn.precise_bn.update_bn_stats (the PyPI package), train mode;
  aimet-style per-batch averaging: every BatchNorm's momentum=None from reset statistics
              (the mean of the batches' means and unbiased variances, as AIMET's
              reestimate_bn_stats and torch.optim.swa_utils.update_bn), train mode.
Time: wall seconds of the re-estimation alone (recal-run: the whole process, model loading
included; the Python ones in this process). Accuracy: the quantization-aware model in eval
mode (fake quantization on, observers frozen) on the 2,000 test images. One table, in
markdown. About 4 minutes on 2 cores.
"""

import argparse
import copy
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tests", "fixtures"))

import safetensors_io  # noqa: E402

SIZE = 32
CLASSES = ("disk", "square", "ring", "frame", "hbar", "vbar", "diag", "antidiag", "plus", "cross")


# ------------------------------------------------------------------------------ the task


def shapes10(n, g):
    """(images n x 3 x 32 x 32, labels n): CLASSES drawn at random places and sizes."""
    labels = torch.randint(0, len(CLASSES), (n,), generator=g)
    ys, xs = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(), indexing="ij")
    cy = SIZE / 2 + torch.empty(n).uniform_(-6, 6, generator=g)
    cx = SIZE / 2 + torch.empty(n).uniform_(-6, 6, generator=g)
    r = torch.empty(n).uniform_(5, 10, generator=g)
    dy, dx = ys[None] - cy[:, None, None], xs[None] - cx[:, None, None]
    r_ = r[:, None, None]
    w = torch.clamp(r_ / 4, min=1.5)
    dist = torch.sqrt(dy ** 2 + dx ** 2)
    box = torch.maximum(dy.abs(), dx.abs())
    masks = torch.stack([
        dist <= r_,
        box <= r_,
        (dist <= r_) & (dist >= r_ - w),
        (box <= r_) & (box >= r_ - w),
        (dy.abs() <= w / 2) & (dx.abs() <= r_),
        (dx.abs() <= w / 2) & (dy.abs() <= r_),
        ((dy - dx).abs() <= w / 1.4) & (box <= r_),
        ((dy + dx).abs() <= w / 1.4) & (box <= r_),
        ((dy.abs() <= w / 2) | (dx.abs() <= w / 2)) & (box <= r_),
        (((dy - dx).abs() <= w / 1.4) | ((dy + dx).abs() <= w / 1.4)) & (box <= r_),
    ], dim=1).float()
    mask = masks[torch.arange(n), labels]
    gy, gx = torch.empty(n, 2).uniform_(-0.5, 0.5, generator=g).unbind(1)
    background = gy[:, None, None] * (ys[None] / SIZE - 0.5) + gx[:, None, None] * (xs[None] / SIZE - 0.5)
    colour = torch.empty(n, 3).uniform_(0.4, 1.0, generator=g) * torch.where(
        torch.rand(n, 1, generator=g) < 0.5, -1.0, 1.0)
    images = background[:, None] + mask[:, None] * colour[:, :, None, None]
    images = images + 0.25 * torch.randn(images.shape, generator=g)
    return images.float(), labels


# ------------------------------------------------------------------------------ the model


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNet8(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.stages = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.fc = nn.Linear(64, len(CLASSES))

    def forward(self, x):
        x = self.stages(F.relu(self.bn(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def train(model, images, labels, epochs, lr, g):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    steps = epochs * math.ceil(len(images) / 128)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(images), generator=g)
        for start in range(0, len(images), 128):
            idx = order[start:start + 128]
            loss = F.cross_entropy(model(images[idx]), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()


def accuracy(model, images, labels):
    model.eval()
    with torch.no_grad():
        return (model(images).argmax(1) == labels).float().mean().item()


def quantization_aware(model, example, weight_bits=4, per_channel=True):
    """prepare_qat_fx at uint8 activations, `weight_bits` symmetric weights (per channel or
    per tensor)."""
    from torch.ao.quantization import FusedMovingAvgObsFakeQuantize, QConfig, QConfigMapping
    from torch.ao.quantization.observer import MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver
    from torch.ao.quantization.quantize_fx import prepare_qat_fx

    activation = FusedMovingAvgObsFakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=0,
                                                         quant_max=255, dtype=torch.quint8)
    half = 2 ** (weight_bits - 1)
    observer = MovingAveragePerChannelMinMaxObserver if per_channel else MovingAverageMinMaxObserver
    weight = FusedMovingAvgObsFakeQuantize.with_args(
        observer=observer, quant_min=-half, quant_max=half - 1, dtype=torch.qint8,
        qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric)
    mapping = QConfigMapping().set_global(QConfig(activation=activation, weight=weight))
    return prepare_qat_fx(copy.deepcopy(model).train(), mapping, example)


def batch_norms(model):
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def observe(model, calibration, on):
    """Observers on (calibrating, model in eval mode) or off."""
    from torch.ao.quantization import disable_observer, enable_observer

    model.apply(enable_observer if on else disable_observer)
    if on:
        model.eval()
        with torch.no_grad():
            for batch in calibration:
                model(batch)
        model.apply(disable_observer)


# ------------------------------------------------------------------------------ the methods


def fvcore_update(model, calibration):
    """fvcore re-estimates the BatchNorms that are in train mode (it leaves the mode as is)."""
    from fvcore.nn.precise_bn import update_bn_stats

    model.train()
    update_bn_stats(model, calibration, num_iters=len(calibration))


def per_batch_average(model, calibration):
    """AIMET-style: the mean of the batches' means and unbiased variances (momentum=None)."""
    saved = []
    for bn in batch_norms(model):
        saved.append(bn.momentum)
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    with torch.no_grad():
        for batch in calibration:
            model(batch)
    for bn, momentum in zip(batch_norms(model), saved):
        bn.momentum = momentum


def recal_run(binary, threads, iterations, work):
    """recal-run on the exported program (written by the caller) and the calibration data; a
    function that loads its result into a model."""
    out, bn = os.path.join(work, "out.pt2"), os.path.join(work, "bn.safetensors")

    def run(model, calibration):
        subprocess.run([binary, "--model", os.path.join(work, "model.pt2"), "--data",
                        "npy:" + os.path.join(work, "calibration.npy"), "--batch_size", str(len(calibration[0])),
                        "--threads", str(threads), "--iterations", str(iterations), "--out", out, "--bn_out", bn],
                       check=True, capture_output=True)
        model.load_state_dict(safetensors_io.load(bn), strict=False)

    return run


def measure(name, method, model, calibration, test):
    candidate = copy.deepcopy(model)
    start = time.perf_counter()
    if method is not None:
        method(candidate, calibration)
    seconds = time.perf_counter() - start
    return name, accuracy(candidate, *test), seconds if method is not None else None


def starting_points(float_model, train_set, calibration, g, weight_bits, per_channel):
    """{"init": the QAT model after quantization initialisation, "qat": after an epoch of QAT}."""
    from torch.ao.quantization import enable_observer

    init = quantization_aware(float_model, (calibration[0][:2],), weight_bits, per_channel)
    observe(init, calibration, on=True)
    qat = copy.deepcopy(init)
    qat.apply(enable_observer)
    train(qat, *train_set, epochs=1, lr=0.01, g=g)
    observe(qat, calibration, on=False)
    return {"init": init, "qat": qat}


def export(model, example, path):
    program = torch.export.export(copy.deepcopy(model).eval(), (example,),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    torch.export.save(program, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(_ROOT, "build", "bin", "recal-run"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--keep", default="", help="keep the exported programs and data here")
    ap.add_argument("--weight_bits", type=int, default=4, choices=range(2, 9))
    ap.add_argument("--per_tensor", action="store_true", help="one weight scale per layer, not per channel")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    t0 = time.time()
    train_set, test = shapes10(6000, g), shapes10(2000, g)
    calibration = list(shapes10(512, g)[0].split(64))
    float_model = ResNet8()
    train(float_model, *train_set, epochs=args.epochs, lr=0.1, g=g)
    float_accuracy = accuracy(float_model, *test)
    print("float32 ResNet-8 trained in %.0f s: test accuracy %.4f" % (time.time() - t0, float_accuracy), flush=True)
    points = starting_points(float_model, train_set, calibration, g, args.weight_bits, not args.per_tensor)

    work = args.keep or tempfile.mkdtemp(prefix="recal-qat-bench-")
    os.makedirs(work, exist_ok=True)
    np.save(os.path.join(work, "calibration.npy"), torch.cat(calibration).numpy())
    rows = []
    for point, model in points.items():
        export(model, calibration[0][:2], os.path.join(work, "model.pt2"))
        methods = [("stored statistics", None),
                   ("recal-run", recal_run(args.bin, args.threads, 1, work)),
                   ("recal-run --iterations 2", recal_run(args.bin, args.threads, 2, work)),
                   ("fvcore update_bn_stats", fvcore_update),
                   ("AIMET-style per-batch average", per_batch_average)]
        for name, method in methods:
            rows.append((point,) + measure(name, method, model, calibration, test))
            print("  %s / %s: %.4f" % (point, name, rows[-1][2]), flush=True)

    print()
    print("ResNet-8 on shapes10, uint8 activations / int%d weights (per %s), test accuracy of 2,000 "
          "images; float32 model: %.1f%%; 512 calibration samples in 8 batches of 64, %d threads"
          % (args.weight_bits, "tensor" if args.per_tensor else "channel", 100 * float_accuracy, args.threads))
    print()
    print("| starting point | BatchNorm statistics | test accuracy | seconds |")
    print("|---|---|---|---|")
    labels = {"init": "after quantization initialisation", "qat": "after 1 epoch of QAT"}
    for point, name, acc, seconds in rows:
        print("| %s | %s | %.1f%% | %s |" % (labels[point], name, 100 * acc, "-" if seconds is None else "%.2f" % seconds))
    print("\ntotal %.0f s" % (time.time() - t0))


if __name__ == "__main__":
    main()
