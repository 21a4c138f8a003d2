#!/usr/bin/env python3
"""`recal-run --folded_out`: the folded model computes what the recalibrated model computes
in eval mode, as PyTorch runs both.

    .venv/bin/python tests/e2e/check_folded.py --bin build/bin/recal-run [--keep DIR]

Programs made here (torch.export, in train mode as Recal's users export them, and in eval
mode, and through run_decompositions): a net of every case folding meets (a convolution
without bias, one with bias, depthwise, 1-d and 3-d convolutions, a linear layer before a
BatchNorm1d, a BatchNorm without affine, one BatchNorm module called after two convolutions,
a BatchNorm after relu, a convolution also called without its BatchNorm, dropout), as float64
(outputs within 1e-10) and float32 (within float32's rounding), and torchvision's ResNet-18
and MobileNetV2 (float32). Each is recalibrated by recal-run with --folded_out; then, in
PyTorch: the recalibrated program in eval mode (exported_programs.eval_module) and the
folded program (torch.export.load(...).module()) run on fresh inputs and must agree; the
folded program holds BatchNorm nodes only for the layers the report keeps, each with the
reason expected; the folded layers' parameters and buffers are gone from its state.
Refused, with the message checked: --folded_out for a TorchScript model, a program with no
BatchNorm to fold, a train-mode program with stochastic depth. Exits 1 on any failure.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "tests", "fixtures"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import exported_programs  # noqa: E402

FAILURES = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)


class Cases(nn.Module):
    """Every case folding meets, on (N, 3, 8, 8) images."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)  # folded, a bias added
        self.stem_bn = nn.BatchNorm2d(8)
        self.with_bias = nn.Conv2d(8, 8, 1)  # folded into its own bias
        self.with_bias_bn = nn.BatchNorm2d(8)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.depthwise_bn = nn.BatchNorm2d(8, affine=False)  # no weight, no bias
        self.after_relu = nn.BatchNorm2d(8)  # kept: follows relu
        self.shared = nn.Conv2d(8, 8, 1, bias=False)  # called twice: kept
        self.shared_bn = nn.BatchNorm2d(8)
        self.left = nn.Conv2d(8, 8, 1, bias=False)
        self.right = nn.Conv2d(8, 8, 1, bias=False)
        self.reused_bn = nn.BatchNorm2d(8)  # after left and after right: folded into both
        self.conv1d = nn.Conv1d(8, 4, 3, padding=1, bias=False)
        self.conv1d_bn = nn.BatchNorm1d(4)
        self.conv3d = nn.Conv3d(1, 2, 3, padding=1)
        self.conv3d_bn = nn.BatchNorm3d(2)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(8 + 4 + 2, 6)
        self.fc_bn = nn.BatchNorm1d(6)

    def forward(self, x):
        x = torch.relu(self.stem_bn(self.stem(x)))
        x = self.with_bias_bn(self.with_bias(x))
        x = self.depthwise_bn(self.depthwise(x))
        x = self.after_relu(torch.relu(x))
        x = self.shared_bn(self.shared(x)) + self.shared(x)
        x = self.reused_bn(self.left(x)) + self.reused_bn(self.right(x))
        line = self.conv1d_bn(self.conv1d(x.mean(3)))
        volume = self.conv3d_bn(self.conv3d(x[:, :1].unsqueeze(1)))
        pooled = torch.cat([x.mean((2, 3)), line.mean(2), volume.mean((2, 3, 4))], 1)
        return self.fc_bn(self.fc(self.drop(pooled)))


CASES_KEPT = {"after_relu": "it follows relu, not a convolution or linear layer",
              "shared_bn": "the layer's weight is shared with another layer"}


class StochasticDepth(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        import torchvision

        return torchvision.ops.stochastic_depth(self.bn(self.conv(x)), 0.2, "row", training=self.training)


class NothingToFold(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(self.bn(x))


def randomise(model, seed):
    """Statistics and affine parameters far from their defaults, so that a fold that drops
    one of them shows."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) * 2 - 1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.data.copy_(torch.rand(m.num_features, generator=g) - 0.5)
    return model


def export(model, example, mode, decompose=False):
    getattr(model, mode)()
    batch = torch.export.Dim("batch", min=2)
    program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    return program.run_decompositions() if decompose else program


def recal_run(binary, model_path, data_path, out, folded, report, batch_size):
    return subprocess.run([binary, "--model", model_path, "--data", "npy:" + data_path, "--out", out,
                           "--folded_out", folded, "--report", report, "--batch_size", str(batch_size),
                           "--max_batches", "4", "--threads", "2"],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


def batch_norm_layers(program):
    """The running_mean keys' layers of the program's BatchNorm calls."""
    names = []
    for node, has_stats, _ in exported_programs.bn_calls(program.graph):
        if has_stats:
            mean = node.args[exported_programs.BN_OPS[node.target][0]]
            spec = {s.arg.name: s.target for s in program.graph_signature.input_specs}
            names.append(spec[mean.name].rsplit(".", 1)[0])
    return names


def check_program(name, program, example, binary, work, dtype, tolerance, kept_expected, batch_size=8):
    path = os.path.join(work, name + ".pt2")
    torch.export.save(program, path)
    data = os.path.join(work, name + ".npy")
    shape = (batch_size * 4,) + tuple(example.shape[1:])
    np.save(data, np.random.default_rng(0).standard_normal(shape).astype(np.float32 if dtype == torch.float32
                                                                          else np.float64))
    out, folded, report = (os.path.join(work, name + suffix) for suffix in (".out.pt2", ".folded.pt2", ".json"))
    run = recal_run(binary, path, data, out, folded, report, batch_size)
    check(run.returncode == 0, "%s: recal-run --folded_out succeeds (%s)" % (name, run.stderr.strip()[-400:]))
    if run.returncode != 0:
        return
    check("folded " in run.stderr, "%s: recal-run says what it folded" % name)
    fold = json.load(open(report)).get("fold", {})
    recalibrated = torch.export.load(out)
    folded_program = torch.export.load(folded)
    kept = {k["name"]: k["reason"] for k in fold.get("kept", [])}
    check(kept == kept_expected, "%s: kept %s, expected %s" % (name, kept, kept_expected))
    all_layers = set(batch_norm_layers(recalibrated))
    check(set(fold.get("folded", [])) == all_layers - set(kept_expected),
          "%s: folded every other layer (%d)" % (name, len(fold.get("folded", []))))
    check(set(batch_norm_layers(folded_program)) == set(kept_expected),
          "%s: the folded program calls BatchNorm for the kept layers only" % name)
    state = exported_programs.program_state(folded_program)
    gone = [k for k in state if k.rsplit(".", 1)[0] in fold.get("folded", [])]
    check(not gone, "%s: no state of a folded layer left (%s)" % (name, gone[:4]))
    reference = exported_programs.eval_module(recalibrated)
    module = folded_program.module()
    worst = 0.0
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn((5,) + tuple(example.shape[1:]), generator=g, dtype=dtype)
        with torch.no_grad():
            want, got = reference(x), module(x)
        worst = max(worst, ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item())
    check(worst <= tolerance, "%s: folded outputs within %.0e of the eval-mode model's (worst %.2e)"
          % (name, tolerance, worst))


def check_refused(name, model_path, example, binary, work, expected):
    data = os.path.join(work, name + ".npy")
    np.save(data, np.random.default_rng(0).standard_normal((32,) + tuple(example.shape[1:])).astype(np.float32))
    run = recal_run(binary, model_path, data, os.path.join(work, name + ".out" + os.path.splitext(model_path)[1]),
                    os.path.join(work, name + ".folded.pt2"), os.path.join(work, name + ".json"), 8)
    check(run.returncode != 0 and expected in run.stderr,
          "%s: refused, saying '%s' (rc %d: %s)" % (name, expected, run.returncode, run.stderr.strip()[-300:]))
    check(not os.path.exists(os.path.join(work, name + ".folded.pt2")), "%s: no folded file written" % name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--keep", help="leave the files in this directory")
    args = parser.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="recal-folded-")
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    try:
        x = torch.randn(8, 3, 8, 8)
        for dtype, tolerance in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
            tag = "f64" if dtype == torch.float64 else "f32"
            for mode in ("train", "eval"):
                model = randomise(Cases(), 1).to(dtype)
                check_program("cases_%s_%s" % (mode, tag), export(model, x.to(dtype), mode), x.to(dtype), args.bin,
                              work, dtype, tolerance, CASES_KEPT)
        model = randomise(Cases(), 2).double()
        # Core ATen IR makes the linear layer an addmm of a transposed weight: kept.
        check_program("cases_decomposed_eval_f64", export(model, x.double(), "eval", decompose=True), x.double(),
                      args.bin, work, torch.float64, 1e-10,
                      dict(CASES_KEPT, fc_bn="it follows addmm, not a convolution or linear layer"))
        import torchvision
        image = torch.randn(4, 3, 64, 64)
        for name, make in (("resnet18", torchvision.models.resnet18), ("mobilenet_v2", torchvision.models.mobilenet_v2)):
            model = randomise(make(num_classes=10), 3)
            check_program(name, export(model, image, "train"), image, args.bin, work, torch.float32, 1e-4, {},
                          batch_size=4)

        stochastic = os.path.join(work, "stochastic.pt2")
        torch.export.save(export(StochasticDepth(), x, "train"), stochastic)
        check_refused("stochastic", stochastic, x, args.bin, work, "random numbers")
        nothing = os.path.join(work, "nothing.pt2")
        torch.export.save(export(NothingToFold(), x, "train"), nothing)
        check_refused("nothing_to_fold", nothing, x, args.bin, work, "it normalises an input of the program")
        script = os.path.join(work, "script.pt")
        torch.jit.save(torch.jit.trace(Cases().eval(), (x,)), script)
        check_refused("torchscript", script, x, args.bin, work, "torch.export programs only")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("%d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
