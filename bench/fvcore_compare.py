#!/usr/bin/python3
"""recal-run against fvcore's update_bn_stats, whole process against whole process.

    /usr/bin/python3 bench/fvcore_compare.py [--bin build/bin/recal-run] [--threads 2]
        [--batches 20] [--batch_size 32] [--size 112] [--repeats 3] [--keep]

Both sides get the same TorchScript archive (resnet18 from tests/fixtures/models.py,
torch.jit.script in eval mode), the same npy data (batches of 32x3x112x112 float32) and
the same thread count (--threads for recal-run, torch.set_num_threads in Python):
  (a) /usr/bin/python3 bench/fvcore_estimator.py  (fvcore's algorithm on Debian's torch;
      eager resnet18 given the archive's weights, because TorchScript makes BN momentum a
      constant fvcore cannot set),
  (b) recal-run --model ... --data npy:... --threads N.
Runs are interleaved (fvcore, recal-run, fvcore, ...) after one untimed warm-up of each;
the table shows median / min wall seconds and the ratio recal-run / fvcore, and how far
the two sets of statistics are apart.
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


def make_inputs(tmp, batches, batch_size, size):
    import numpy as np
    import torch

    import models

    model, _ = models.build("resnet18")
    model.eval()
    path_model = os.path.join(tmp, "resnet18.scripted_eval.pt")
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
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    args = ap.parse_args()

    binary = os.path.abspath(args.bin)
    have_bin = os.path.isfile(binary) and os.access(binary, os.X_OK)
    tmp = tempfile.mkdtemp(prefix="recal-bench-")
    try:
        t0 = time.time()
        model, data = make_inputs(tmp, args.batches, args.batch_size, args.size)
        print("inputs: resnet18 scripted (eval), %d batches of %dx3x%dx%d float32 npy, threads %d (made in %.1fs)"
              % (args.batches, args.batch_size, args.size, args.size, args.threads, time.time() - t0))
        fv_out = os.path.join(tmp, "fvcore_state.pt")
        fv_cmd = [PYTHON, os.path.join(_ROOT, "bench", "fvcore_estimator.py"), "--model", model, "--family", "resnet18",
                  "--data", "npy:" + data, "--batch_size", str(args.batch_size), "--batches", str(args.batches),
                  "--threads", str(args.threads), "--out", fv_out]
        rc_cmd = [binary, "--model", model, "--data", "npy:" + data, "--out", os.path.join(tmp, "out.pt"),
                  "--bn_out", os.path.join(tmp, "bn.safetensors"), "--report", os.path.join(tmp, "report.json"),
                  "--batch_size", str(args.batch_size), "--max_batches", str(args.batches),
                  "--threads", str(args.threads)]
        if not have_bin:
            print("recal-run not found at %s: timing fvcore only" % binary)
        env_note = None
        times = {"fvcore": [], "recal-run": []}
        # One untimed warm-up each (page cache, first-run effects).
        _, out = timed(fv_cmd)
        env_note = json.loads(out.strip().splitlines()[-1])
        if have_bin:
            timed(rc_cmd)
        for _ in range(args.repeats):
            times["fvcore"].append(timed(fv_cmd)[0])
            if have_bin:
                times["recal-run"].append(timed(rc_cmd)[0])

        print("fvcore side: %s (%d BN layers; last run: import %.2fs, load %.2fs, compute %.2fs, save %.2fs)" % (
            env_note["model"], env_note["bn_layers"], env_note["import_s"], env_note["load_s"],
            env_note["compute_s"], env_note["save_s"]))
        print()
        print("| %-10s | %8s | %8s | %s |" % ("tool", "median s", "min s", "runs"))
        print("|%s|%s|%s|%s|" % ("-" * 12, "-" * 10, "-" * 10, "-" * 30))
        for name, ts in times.items():
            if ts:
                print("| %-10s | %8.2f | %8.2f | %s |" % (name, statistics.median(ts), min(ts),
                                                         " ".join("%.2f" % t for t in ts)))
        if times["recal-run"]:
            ratio = statistics.median(times["recal-run"]) / statistics.median(times["fvcore"])
            print()
            print("ratio recal-run / fvcore (median wall time): %.2f" % ratio)
            wm, wv = compare_stats(fv_out, os.path.join(tmp, "bn.safetensors"))
            print("statistics apart (fvcore vs recal-run): mean %.2e (in units of std), var %.2e (relative)" % (wm, wv))
    finally:
        if args.keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
