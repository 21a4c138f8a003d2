#!/usr/bin/python3
"""recal-run against fvcore's update_bn_stats, whole process against whole process.

    /usr/bin/python3 bench/fvcore_compare.py [--bin build/bin/recal-run] [--threads 2]
        [--families resnet18,mobilenet_v2] [--batches 20] [--batch_size 32] [--size 112]
        [--repeats 5] [--keep]

For each family, both sides get the same TorchScript archive (from tests/fixtures/models.py,
torch.jit.script in eval mode), the same npy data (batches of 32x3x112x112 float32) and
the same thread count (--threads for recal-run, torch.set_num_threads in Python):
  (a) /usr/bin/python3 bench/fvcore_estimator.py  (fvcore's algorithm on Debian's torch;
      eager resnet18 given the archive's weights, because TorchScript makes BN momentum a
      constant fvcore cannot set),
  (b) recal-run --model ... --data npy:... --threads N.
Runs are interleaved (fvcore, recal-run, fvcore, ...) after one untimed warm-up of each;
the table shows median / min wall seconds, the median of the per-pair ratios recal-run /
fvcore (each pair ran back to back, so drift on a shared machine hits both alike), and how
far the two sets of statistics are apart. First, the process start of each side alone
(recal-run --version; python3 -c "import torch, torchvision").
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tests", "fixtures"))

PYTHON = "/usr/bin/python3"


def make_inputs(tmp, family, batches, batch_size, size):
    import numpy as np
    import torch

    import models

    model, _ = models.build(family)
    model.eval()
    path_model = os.path.join(tmp, "%s.scripted_eval.pt" % family)
    torch.jit.save(torch.jit.script(model), path_model)
    g = torch.Generator().manual_seed(1234)
    n = batches * batch_size
    path_data = os.path.join(tmp, "data.npy")
    # Written in chunks: the full array can be large.
    arr = np.lib.format.open_memmap(path_data, mode="w+", dtype="<f4", shape=(n, 3, size, size))
    for start in range(0, n, batch_size):
        arr[start : start + batch_size] = torch.randn((min(batch_size, n - start), 3, size, size), generator=g).numpy()
    arr.flush()
    del arr
    return path_model, path_data


def timed(cmd):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit("command failed (exit %d): %s\n%s" % (p.returncode, " ".join(cmd),
                                                               p.stderr.decode("utf-8", "replace")[-2000:]))
    return dt, p.stdout.decode("utf-8", "replace")


def compare_stats(fvcore_state, recal_bn):
    """max over layers/channels of |a-b| / scale, for means and variances."""
    import torch

    import safetensors_io

    a = torch.load(fvcore_state)
    b = safetensors_io.load(recal_bn)
    worst_m = worst_v = 0.0
    for k, v in b.items():
        if k not in a:
            continue
        x, y = a[k].double(), v.double()
        if k.endswith("running_mean"):
            var = b[k[: -len("mean")] + "var"].double()
            scale = torch.maximum(y.abs(), var.clamp(min=0).sqrt())
            worst_m = max(worst_m, ((x - y).abs() / scale.clamp(min=1e-30)).max().item())
        else:
            worst_v = max(worst_v, ((x - y).abs() / y.abs().clamp(min=1e-30)).max().item())
    return worst_m, worst_v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(_ROOT, "build", "bin", "recal-run"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--families", default="resnet18,mobilenet_v2")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    args = ap.parse_args()

    binary = os.path.abspath(args.bin)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        raise SystemExit("recal-run not found at %s (scripts/build.sh builds it)" % binary)
    tmp = tempfile.mkdtemp(prefix="recal-bench-")
    try:
        starts = {"recal-run": [], "python": []}
        for _ in range(args.repeats):
            starts["recal-run"].append(timed([binary, "--version"])[0])
            starts["python"].append(timed([PYTHON, "-c", "import torch, torchvision"])[0])
        print("process start, median of %d: recal-run --version %.2f s; python3 -c 'import torch, torchvision' %.2f s"
              % (args.repeats, statistics.median(starts["recal-run"]), statistics.median(starts["python"])))
        ratios = {}
        for family in args.families.split(","):
            ratios[family] = compare_family(args, binary, tmp, family)
        print()
        print("| family | recal-run / fvcore (median of per-pair ratios) |")
        print("|---|---|")
        for family, ratio in ratios.items():
            print("| %s | %.2f |" % (family, ratio))
    finally:
        if args.keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def compare_family(args, binary, tmp, family):
    t0 = time.time()
    model, data = make_inputs(tmp, family, args.batches, args.batch_size, args.size)
    print()
    print("%s scripted (eval), %d batches of %dx3x%dx%d float32 npy, threads %d (made in %.1fs)"
          % (family, args.batches, args.batch_size, args.size, args.size, args.threads, time.time() - t0))
    fv_out = os.path.join(tmp, "fvcore_state.pt")
    bn_out = os.path.join(tmp, "bn.safetensors")
    fv_cmd = [PYTHON, os.path.join(_ROOT, "bench", "fvcore_estimator.py"), "--model", model, "--family", family,
              "--data", "npy:" + data, "--batch_size", str(args.batch_size), "--batches", str(args.batches),
              "--threads", str(args.threads), "--out", fv_out]
    rc_cmd = [binary, "--model", model, "--data", "npy:" + data, "--out", os.path.join(tmp, "out.pt"),
              "--bn_out", bn_out, "--report", os.path.join(tmp, "report.json"),
              "--batch_size", str(args.batch_size), "--max_batches", str(args.batches),
              "--threads", str(args.threads)]
    times = {"fvcore": [], "recal-run": []}
    # One untimed warm-up each (page cache, first-run effects).
    _, out = timed(fv_cmd)
    env_note = json.loads(out.strip().splitlines()[-1])
    timed(rc_cmd)
    for _ in range(args.repeats):
        times["fvcore"].append(timed(fv_cmd)[0])
        times["recal-run"].append(timed(rc_cmd)[0])
    with open(os.path.join(tmp, "report.json")) as f:
        report = json.load(f)

    print("fvcore side: %s (%d BN layers; last run: import %.2fs, load %.2fs, compute %.2fs, save %.2fs)" % (
        env_note["model"], env_note["bn_layers"], env_note["import_s"], env_note["load_s"],
        env_note["compute_s"], env_note["save_s"]))
    print("recal-run side: forward and statistics %.2fs of the last run (%s, %s)" % (
        report.get("seconds", 0), report.get("memory_format", "?"), report.get("compute_dtype", "?")))
    print()
    print("| %-10s | %8s | %8s | %s |" % ("tool", "median s", "min s", "runs"))
    print("|%s|%s|%s|%s|" % ("-" * 12, "-" * 10, "-" * 10, "-" * 40))
    for name, ts in times.items():
        print("| %-10s | %8.2f | %8.2f | %s |" % (name, statistics.median(ts), min(ts),
                                                 " ".join("%.2f" % t for t in ts)))
    ratio = statistics.median(r / f for r, f in zip(times["recal-run"], times["fvcore"]))
    print()
    print("ratio recal-run / fvcore (median of per-pair ratios): %.2f" % ratio)
    wm, wv = compare_stats(fv_out, bn_out)
    print("statistics apart (fvcore vs recal-run): mean %.2e (in units of std), var %.2e (relative)" % (wm, wv))
    return ratio


if __name__ == "__main__":
    sys.exit(main())
