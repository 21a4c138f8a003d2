#!/usr/bin/env python3
"""The GPU path end to end (issue 31), the checks that scripts/gpu_check.sh runs once it has
binaries: run it through that script, which finds the GPU, builds and says what it ran on.

    PY scripts/gpu_check.py --bin BUILD/bin --device cuda:0|cpu [--work DIR] [--keep]

On `--device cuda:N` (the real check, ResNet-50) or `cpu` (the dry run: ResNet-18 and small
batches, so that every step runs in CI in well under two minutes):
  1. exactness: the model in float64 (TorchScript), recal-run on the device, every running
     mean/var against tests/fixtures/reference.py's float64 reference (the agreed metric,
     rtol 1e-5); the float32 model in contiguous and channels-last layout without TF32
     against the same reference within float32's tolerance, and as LibTorch's defaults run
     it (TF32 convolutions on a GPU) and under bfloat16 autocast within the loose bounds
     that catch garbage, their errors printed; every report must name the device and the
     layout / dtype asked for.
  2. throughput: recal-run's samples/s on the float32 model and large batches, steady state
     (two runs of different lengths, so that start-up, model load and the first batch's
     cuDNN set-up cancel), against a plain train-mode forward of the same model in this
     python on the same device (batches pinned and copied without blocking, as the engine's
     are): the ratio, for contiguous float32, channels-last and bfloat16.
  2b. the statistics kernel (issue 46): where recal-run has Recal's CUDA kernel (its
     --version says), the same runs with RECAL_GPU_STATISTICS=aten beside it (ATen's
     kernels), the trap of an input-normalising BatchNorm (float32, mean 100, std 0.01)
     within 1e-5 of the float64 reference, and the samples/s of both; against peers in this
     python on the same device: torch.optim.swa_utils.update_bn and fvcore's update_bn_stats
     (where fvcore imports), MobileNetV2 beside ResNet-50 (where torchvision imports).
  3. the service: recal-server --devices=<device> on a loopback port runs a job in its
     sandboxed worker (recalctl run: upload, submit, wait, download), the result against the
     reference; and a client-stream job (pushed batches, pinned in the worker on a GPU).
Prints one table; exits 1 if any check failed.

Needs only torch in this python (no numpy: data files are written directly; torchvision if
present, else the same ResNet written out below), so that it runs with a GPU machine's own
torch environment.
"""
import argparse
import copy
import ctypes
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fixtures"))
import reference  # noqa: E402  (the independent float64 reference)

# TorchScript is what the engine takes; torch 2.9+ says on every call that it is deprecated.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")

# What each run uses: the GPU check is ResNet-50 at full size; the dry run a small net, small
# images and few batches (2 shared cores in CI).
PROFILES = {
    "gpu": dict(arch="resnet50", exact=dict(size=112, batch=16, batches=4),
                speed=dict(size=224, batch=64, warm=4, batches=44), baseline_warm=3),
    "cpu": dict(arch="resnet18", exact=dict(size=32, batch=4, batches=3),
                speed=dict(size=48, batch=8, warm=1, batches=3), baseline_warm=1),
}
# The agreed metric's tolerance (rtol, in units of max(|mean|, std) and of var): float64 is
# exact (1e-12: the float64 zoo lands within 1e-13 on the CPU, 3.5e-14 on the H200); float32 through 20-50 layers drifts (deep float32 nets are chaotic: 2e-5 seen on
# ResNet-50 at 112 px on the CPU); bfloat16 rounds every activation to 8 bits of mantissa and
# gives the statistics of a model run in bfloat16, tens of per cent from the float32 ones in
# the deepest layers of a random-init ResNet (0.15 seen on ResNet-50 at 112 px on the CPU,
# 0.39 on the dry run's ResNet-18 on 32 px): that check catches garbage (a wrong layer,
# zeros, the dtype ignored), no more. So does "tf32": float32 as LibTorch runs it on a GPU by
# default, convolutions in TF32 (10 bits of mantissa; cuDNN's allow_tf32), which the GPU
# check measures and reports rather than bounds.
RTOL = {"float64": 1e-12, "float32": 1e-3, "bfloat16": 0.5, "tf32": 0.5, "trap": 1e-5}
# For the float32 checks that must hold to float32's tolerance on a GPU: cuDNN and cuBLAS
# without TF32 (NVIDIA's switch, honoured by both).
NO_TF32 = {"NVIDIA_TF32_OVERRIDE": "0"}
# The GPU path's statistics: Recal's CUDA kernel (the default where it is built) or ATen's
# kernels (RECAL_GPU_STATISTICS=aten), compared side by side where the kernel is built.
ATEN_STATISTICS = {"RECAL_GPU_STATISTICS": "aten"}


class Table:
    def __init__(self):
        self.rows = []

    def add(self, name, ok, detail):
        self.rows.append((name, ok, detail))
        print(f"gpu_check: {'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        return ok

    def failed(self):
        return [name for name, ok, _ in self.rows if not ok]

    def print(self):
        width = max(len(name) for name, _, _ in self.rows)
        print()
        print(f"{'check':<{width}}  result  detail")
        for name, ok, detail in self.rows:
            print(f"{name:<{width}}  {'ok' if ok else 'FAIL':<6}  {detail}")


# ---------------------------------------------------------------------------- the model


class Block(nn.Module):
    """torchvision's ResNet blocks and names, for a python without torchvision: two 3x3
    convolutions (BasicBlock) or 1x1, 3x3, 1x1 (Bottleneck)."""

    def __init__(self, inplanes, planes, stride, convs, out):
        super().__init__()
        for i, (cin, cout, k, s) in enumerate(convs, 1):
            setattr(self, f"conv{i}", nn.Conv2d(cin, cout, k, s, k // 2, bias=False))
            setattr(self, f"bn{i}", nn.BatchNorm2d(cout))
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def shortcut(self, x):
        return x if self.downsample is None else self.downsample(x)


class BasicBlock(Block):
    def __init__(self, inplanes, planes, stride):
        super().__init__(inplanes, planes, stride, [(inplanes, planes, 3, stride), (planes, planes, 3, 1)], planes)

    def forward(self, x):
        y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(y + self.shortcut(x))


class Bottleneck(Block):
    def __init__(self, inplanes, planes, stride):
        super().__init__(inplanes, planes, stride,
                         [(inplanes, planes, 1, 1), (planes, planes, 3, stride), (planes, planes * 4, 1, 1)], planes * 4)

    def forward(self, x):
        y = self.relu(self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))))
        return self.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, blocks, basic, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        for i, (n, planes) in enumerate(zip(blocks, (64, 128, 256, 512)), 1):
            layer = []
            for j in range(n):
                block = BasicBlock if basic else Bottleneck
                layer.append(block(inplanes, planes, 2 if j == 0 and i > 1 else 1))
                inplanes = planes * (1 if basic else 4)
            setattr(self, f"layer{i}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def make_model(arch):
    """(eager model, where it came from): random init, num_classes=10, old statistics and affine
    parameters away from the defaults so that a layer left untouched would show."""
    torch.manual_seed(0)
    try:
        import torchvision
        model, source = getattr(torchvision.models, arch)(num_classes=10), f"torchvision {torchvision.__version__}"
    except ImportError:
        blocks = {"resnet18": ((2, 2, 2, 2), True), "resnet50": ((3, 4, 6, 3), False)}[arch]
        model, source = ResNet(*blocks, num_classes=10), "scripts/gpu_check.py's ResNet (no torchvision here)"
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.copy_(0.1 * torch.randn(mod.running_mean.shape, generator=g))
                mod.running_var.copy_(0.5 + torch.rand(mod.running_var.shape, generator=g))
                mod.weight.copy_(0.5 + torch.rand(mod.weight.shape, generator=g))
                mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=g))
    return model.eval(), source


def make_second_model(profile):
    """MobileNetV2 (depthwise convolutions, 52 BatchNorms) for the peers' check on a GPU, where
    torchvision imports: (model, name), else None."""
    if profile["arch"] != "resnet50":
        return None
    try:
        import torchvision
    except ImportError:
        return None
    torch.manual_seed(0)
    return torchvision.models.mobilenet_v2(num_classes=10).eval(), "mobilenet_v2"


def save_script(model, path, dtype):
    torch.jit.save(torch.jit.script(copy.deepcopy(model).to(dtype)), path)
    return path


# ---------------------------------------------------------------------------- data


def save_npy(path, batches):
    """The batches as one .npy file (format 1.0, data 64-byte aligned), without numpy."""
    first = batches[0]
    descr = {torch.float32: "<f4", torch.float64: "<f8"}[first.dtype]
    shape = (sum(b.shape[0] for b in batches),) + tuple(first.shape[1:])
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        for b in batches:
            b = b.contiguous()
            f.write(ctypes.string_at(b.data_ptr(), b.numel() * b.element_size()))
    return path


def make_batches(batch, batches, size, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn((batch, 3, size, size), generator=g, dtype=dtype) for _ in range(batches)]


# ---------------------------------------------------------------------------- running


def run(cmd, what, timeout=600, env=None):
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc, time.time() - started


def recal_run(args, model, data, batch, out_dir, name, extra=(), env=None):
    """recal-run on the device (`env`: variables added to this one's); returns (report dict,
    recalibrated buffers)."""
    out = os.path.join(out_dir, name + ".pt")
    report_path = os.path.join(out_dir, name + ".report.json")
    cmd = [os.path.join(args.bin, "recal-run"), "--model", model, "--data", "npy:" + data, "--out", out,
           "--report", report_path, "--batch_size", str(batch), "--device", args.device, *extra]
    run(cmd, "recal-run " + name, env=dict(os.environ, **env) if env else None)
    with open(report_path) as f:
        report = json.load(f)
    return report, buffers_of(out)


def has_statistics_kernel(args):
    """Whether recal-run measures statistics with Recal's CUDA kernel (its --version says)."""
    proc, _ = run([os.path.join(args.bin, "recal-run"), "--version"], "recal-run --version")
    return "Recal's CUDA kernel" in proc.stdout


def buffers_of(path):
    return {k: v.double().cpu() for k, v in torch.jit.load(path, map_location="cpu").named_buffers()}


def report_names(report, device, memory_format=None, compute_dtype=None):
    """'' if the report says what ran, else what it says instead."""
    wrong = []
    if report.get("device") != device:
        wrong.append(f"device {report.get('device')!r}")
    if memory_format and report.get("memory_format") != memory_format:
        wrong.append(f"memory_format {report.get('memory_format')!r}")
    if compute_dtype and report.get("compute_dtype") != compute_dtype:
        wrong.append(f"compute_dtype {report.get('compute_dtype')!r}")
    return ", ".join(wrong)


def judge(table, name, report, buffers, ref, rtol, device, **asked):
    worst = reference.worst_error(buffers, ref, rtol)
    wrong = report_names(report, device, **asked)
    detail = f"worst {worst:.3g} of rtol {rtol:g} over {len(ref)} buffers, {report.get('samples')} samples"
    if wrong:
        detail += f"; the report says {wrong}"
    return table.add(name, worst <= 1.0 and not wrong, detail)


# ---------------------------------------------------------------------------- the checks


def check_exactness(args, profile, model, table, work):
    """Float64 exact; float32 contiguous / channels-last and bfloat16 within their tolerances."""
    p = profile["exact"]
    batches64 = make_batches(p["batch"], p["batches"], p["size"], torch.float64, seed=2)
    ref = reference.reference_stats(copy.deepcopy(model).double(), batches64)
    data64 = save_npy(os.path.join(work, "exact64.npy"), batches64)
    data32 = save_npy(os.path.join(work, "exact32.npy"), [b.float() for b in batches64])
    m64 = save_script(model, os.path.join(work, "model64.pt"), torch.float64)
    m32 = save_script(model, os.path.join(work, "model32.pt"), torch.float32)
    arch = profile["arch"]
    report, buffers = recal_run(args, m64, data64, p["batch"], work, "exact64")
    judge(table, f"{arch} float64 vs reference", report, buffers, ref, RTOL["float64"], args.device)
    gpu = args.device.startswith("cuda")
    if gpu and args.kernel:
        report, buffers = recal_run(args, m64, data64, p["batch"], work, "exact64_aten", env=ATEN_STATISTICS)
        judge(table, f"{arch} float64 vs reference, ATen's statistics", report, buffers, ref, RTOL["float64"],
              args.device)
    for tag, name, extra, asked, rtol, env in (
            ("contiguous", "float32 contiguous, no TF32", ["--memory_format", "contiguous"],
             dict(memory_format="contiguous"), RTOL["float32"], NO_TF32),
            ("channels_last", "float32 channels_last, no TF32", ["--memory_format", "channels_last"],
             dict(memory_format="channels_last"), RTOL["float32"], NO_TF32),
            ("defaults", "float32 as LibTorch's defaults run it", [], {}, RTOL["tf32" if gpu else "float32"], None),
            ("bfloat16", "bfloat16", ["--compute_dtype", "bfloat16"], dict(compute_dtype="bfloat16"),
             RTOL["bfloat16"], None)):
        report, buffers = recal_run(args, m32, data32, p["batch"], work, tag, extra, env)
        judge(table, f"{arch} {name} vs reference", report, buffers, ref, rtol, args.device, **asked)
    return dict(ref=ref, m64=m64, m32=m32, data64=data64, data32=data32, batch=p["batch"])


def baseline_rate(model, batches, device, warm, channels_last=False, bf16=False):
    """Samples/s of a plain train-mode forward (what a precise-BN loop in Python does), after
    `warm` batches; batches pinned on a GPU and copied without blocking, as the engine's are."""
    model = copy.deepcopy(model).float().to(device).train()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    samples, start = 0, None
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
        for i, x in enumerate(batches):
            if i == warm:
                sync()
                start = time.perf_counter()
            x = x.to(dev, non_blocking=True)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            model(x)
            if i >= warm:
                samples += x.shape[0]
        sync()
    return samples / (time.perf_counter() - start)


def recal_rate(args, model, data, p, work, name, extra, env=None):
    """recal-run's steady samples/s: two runs of different lengths, so that everything before
    the batches (start-up, load, the first batch's set-up) cancels out of the difference.
    Where that difference drowns in noise (a few small batches on a busy CPU, the dry run),
    the longer run's own rate, said so. Returns (rate, how, the longer run's report)."""
    short, _ = recal_run(args, model, data, p["batch"], work, name + "_short", ["--max_batches", str(p["warm"]), *extra],
                         env)
    full, _ = recal_run(args, model, data, p["batch"], work, name, ["--max_batches", str(p["batches"]), *extra], env)
    samples = int(full["samples"]) - int(short["samples"])
    seconds = float(full["seconds"]) - float(short["seconds"])
    if samples > 0 and seconds > 0:
        return samples / seconds, f"steady, batches {p['warm'] + 1}-{p['batches']}", full
    return int(full["samples"]) / float(full["seconds"]), "whole run: the difference of two was noise", full


def check_throughput(args, profile, model, table, work):
    p = profile["speed"]
    batches = make_batches(p["batch"], p["batches"], p["size"], torch.float32, seed=3)
    data = save_npy(os.path.join(work, "speed.npy"), batches)
    m32 = save_script(model, os.path.join(work, "speed32.pt"), torch.float32)
    if args.device.startswith("cuda"):
        batches = [b.pin_memory() for b in batches]
    for name, extra, cl, bf16 in (("float32", ["--memory_format", "contiguous"], False, False),
                                  ("channels_last", ["--memory_format", "channels_last"], True, False),
                                  ("bfloat16", ["--memory_format", "contiguous", "--compute_dtype", "bfloat16"], False,
                                   True)):
        rate, how, report = recal_rate(args, m32, data, p, work, "speed_" + name, extra)
        base = baseline_rate(model, batches, args.device, profile["baseline_warm"], cl, bf16)
        wrong = report_names(report, args.device)
        # Both sides as LibTorch's defaults run them (TF32 convolutions on a GPU).
        table.add(f"samples/s {name} ({p['batch']}x3x{p['size']}x{p['size']})", rate > 0 and not wrong,
                  f"recalibration {rate:.1f} ({how}), plain train-mode forward {base:.1f}: ratio {rate / base:.2f}"
                  + (f"; the report says {wrong}" if wrong else ""))


class InputNormalisingNet(nn.Module):
    """The trap (issue 46): a BatchNorm on raw inputs far from zero (mean 100, std 0.01, in
    float32), whose statistics E[x²] - E[x]² in float32 gets wrong, then a convolution and
    BatchNorms after it."""

    def __init__(self):
        super().__init__()
        self.bn_in = nn.BatchNorm2d(3)
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)

    def forward(self, x):
        return self.bn2(self.conv2(torch.relu(self.bn(self.conv(self.bn_in(x))))))


def check_trap(args, table, work):
    """The input-normalising BatchNorm in float32 against the float64 reference: Recal's
    kernel, and ATen's statistics beside it (said, not failed: the fused kernel's float32
    statistics are what issue 46 replaces)."""
    torch.manual_seed(5)
    model = InputNormalisingNet().eval()
    batches = [torch.randn(16, 3, 32, 32, dtype=torch.float64) * 0.01 + 100 for _ in range(4)]
    ref = reference.reference_stats(copy.deepcopy(model).double(), batches)
    data = save_npy(os.path.join(work, "trap32.npy"), [b.float() for b in batches])
    m32 = save_script(model, os.path.join(work, "trap32.pt"), torch.float32)
    report, buffers = recal_run(args, m32, data, 16, work, "trap", [], NO_TF32)
    judge(table, "input BatchNorm at mean 100, std 0.01 (float32) vs reference", report, buffers, ref, RTOL["trap"],
          args.device)
    if args.device.startswith("cuda") and args.kernel:
        _, buffers = recal_run(args, m32, data, 16, work, "trap_aten", [], dict(NO_TF32, **ATEN_STATISTICS))
        worst = reference.worst_error(buffers, ref, RTOL["trap"])
        table.add("the same with ATen's statistics (said, not judged)", True, f"worst {worst:.3g} of rtol {RTOL['trap']:g}")


def peer_rates(model, batches, device, warm):
    """Samples/s of what users run instead, in this python on the same device: torch's
    swa_utils.update_bn, and fvcore's update_bn_stats where fvcore imports. {name: rate}."""
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    model = copy.deepcopy(model).float().to(dev)
    rates = {}

    def timed(name, fn, loader):
        fn(loader[:warm])  # cuDNN's set-up, the allocator's first blocks
        sync()
        start = time.perf_counter()
        fn(loader[warm:])
        sync()
        rates[name] = sum(b.shape[0] for b in loader[warm:]) / (time.perf_counter() - start)

    on_device = [b.to(dev, non_blocking=True) for b in batches]
    from torch.optim import swa_utils
    timed("swa_utils.update_bn", lambda loader: swa_utils.update_bn(loader, model), on_device)
    try:
        from fvcore.nn.precise_bn import update_bn_stats
    except ImportError:
        return rates
    model.train()  # fvcore updates only the BatchNorms in training mode
    timed("fvcore update_bn_stats", lambda loader: update_bn_stats(model, iter(loader), num_iters=len(loader)),
          on_device)
    return rates


def check_peers(args, profile, model, table, work, arch):
    """Recalibration's samples/s (Recal's kernel, and ATen's beside it where the kernel is
    built) against a plain train-mode forward and the peers, float32 as LibTorch's defaults
    run it."""
    p = profile["speed"]
    batches = make_batches(p["batch"], p["batches"], p["size"], torch.float32, seed=4)
    data = save_npy(os.path.join(work, f"peers_{arch}.npy"), batches)
    m32 = save_script(model, os.path.join(work, f"peers_{arch}.pt"), torch.float32)
    if args.device.startswith("cuda"):
        batches = [b.pin_memory() for b in batches]
    rate, how, _ = recal_rate(args, m32, data, p, work, f"peers_{arch}", [])
    base = baseline_rate(model, batches, args.device, profile["baseline_warm"])
    detail = [f"recalibration {rate:.1f} ({how})", f"forward {base:.1f} (ratio {rate / base:.2f})"]
    if args.device.startswith("cuda") and args.kernel:
        aten, _, _ = recal_rate(args, m32, data, p, work, f"peers_{arch}_aten", [], ATEN_STATISTICS)
        detail.append(f"with ATen's statistics {aten:.1f} (ratio {aten / base:.2f})")
    for name, peer in peer_rates(model, batches, args.device, profile["baseline_warm"]).items():
        detail.append(f"{name} {peer:.1f} (time ratio {peer / rate:.2f})")
    table.add(f"samples/s {arch} against peers ({p['batch']}x3x{p['size']}x{p['size']})", rate > 0, "; ".join(detail))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(recalctl, server, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        if subprocess.run([recalctl, "--server", server, "health"], capture_output=True).returncode == 0:
            return True
        time.sleep(0.5)
    return False


def check_server(args, exact, table, work):
    """A job through recal-server on a worker of the device, in its sandbox; and a pushed one."""
    root = os.path.join(work, "data_root")
    os.makedirs(root, exist_ok=True)
    data64 = shutil.copy(exact["data64"], os.path.join(root, "exact64.npy"))
    port = free_port()
    server = f"127.0.0.1:{port}"
    log_path = os.path.join(work, "server.log")
    recalctl = os.path.join(args.bin, "recalctl")
    cmd = [os.path.join(args.bin, "recal-server"), f"--listen={server}", f"--data_dir={work}/server",
           f"--data_root={root}", f"--devices={args.device}", "--metrics_listen=", "--threads_per_worker=0"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        if not wait_healthy(recalctl, server, proc):
            return table.add(f"recal-server --devices={args.device}", False, f"not healthy; log: {tail(log_path)}")
        for name, model, data, extra, rtol in (
                ("job", exact["m64"], "npy:" + data64, [], RTOL["float64"]),
                # The worker runs float32 as LibTorch's defaults do (TF32 convolutions on a GPU).
                ("pushed job", exact["m32"], "npy:" + exact["data32"], ["--stream"],
                 RTOL["tf32" if args.device.startswith("cuda") else "float32"])):
            out = os.path.join(work, f"server_{name.replace(' ', '_')}")
            # A long per-call deadline: on two busy cores (the dry run in CI) a connection has
            # been seen to take longer than recalctl's default 30 s.
            cmd = [recalctl, "--server", server, "--deadline", "120", "run", model, "--data", data, "-o", out + ".pt",
                   "--report", out + ".json", "--batch_size", str(exact["batch"]), "--output=json", *extra]
            try:
                run(cmd, "recalctl run", timeout=300)
            except RuntimeError as e:
                table.add(f"recal-server {name} on {args.device}", False, f"{e}; log: {tail(log_path)}")
                continue
            with open(out + ".json") as f:
                report = json.load(f)
            judge(table, f"recal-server {name} on {args.device} (sandboxed)", report, buffers_of(out + ".pt"),
                  exact["ref"], rtol, args.device)
        check_server_log(args, log_path, table)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def check_server_log(args, log_path, table):
    """On a GPU the worker's sandbox is said once: the NVIDIA devices it admits, no RLIMIT_AS."""
    with open(log_path) as f:
        log = f.read()
    if not args.device.startswith("cuda"):
        return
    line = next((l for l in log.splitlines() if "GPU jobs run in sandboxed workers" in l), "")
    # Where the kernel has no Landlock nothing confines files, the devices included: said, not failed.
    landlock = "landlock-files" in line
    ok = "RLIMIT_AS: none on a GPU worker" in line and (not landlock or "landlock-gpu-devices: /dev/nvidia" in line)
    table.add("GPU worker's sandbox in the server log", ok,
              ("" if landlock or not line else "no Landlock on this kernel; ") + (line.strip()[-300:] or "no such line"))


def tail(path, lines=5):
    try:
        with open(path) as f:
            return " | ".join(f.read().strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="directory of recal-run, recal-server, recal-worker, recalctl")
    parser.add_argument("--device", required=True, help="cuda:N, or cpu for the dry run")
    parser.add_argument("--work", help="working directory (default: a temporary one, removed)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--started", type=float, default=time.time(), help="when the whole check began (epoch s)")
    parser.add_argument("--budget", type=float, default=480, help="seconds the whole check may take")
    args = parser.parse_args()
    profile = PROFILES["gpu" if args.device.startswith("cuda") else "cpu"]
    work = args.work or tempfile.mkdtemp(prefix="gpu_check-")
    os.makedirs(work, exist_ok=True)
    table = Table()
    try:
        model, source = make_model(profile["arch"])
        name = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "CPU"
        print(f"gpu_check: {profile['arch']} ({source}) on {args.device} ({name}), torch {torch.__version__}",
              flush=True)
        args.kernel = has_statistics_kernel(args)
        print(f"gpu_check: statistics by {'Recal' if args.kernel else 'ATen'}'s kernels", flush=True)
        exact = check_exactness(args, profile, model, table, work)
        check_trap(args, table, work)
        check_throughput(args, profile, model, table, work)
        check_peers(args, profile, model, table, work, profile["arch"])
        second = make_second_model(profile)
        if second is not None:
            check_peers(args, profile, second[0], table, work, second[1])
        check_server(args, exact, table, work)
    except Exception as e:  # every failure is a row of the table, never a traceback alone
        table.add("unexpected error", False, f"{type(e).__name__}: {e}")
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.time() - args.started
    table.add("total time", elapsed <= args.budget, f"{elapsed:.0f} s (budget {args.budget:.0f} s)")
    table.print()
    failed = table.failed()
    print(f"\ngpu_check: {'FAILED: ' + ', '.join(failed) if failed else 'every check passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
