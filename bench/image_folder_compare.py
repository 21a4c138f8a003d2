#!/usr/bin/env -S sh -c 'exec "$(dirname "$0")/../.venv/bin/python" "$0" "$@"'
"""recal-run on an image folder against the same job in Python (torchvision ImageFolder +
DataLoader + fvcore's precise BN), whole process against whole process.

    .venv/bin/python bench/image_folder_compare.py --bin build/bin/recal-run --model M.pt
        --folder DIR [--resize 128 --crop 112 --batch_size 32 --workers 1 --threads 1
        --repeats 3]

Both sides read the same folder (bench/make_image_folder.py) with the same transform
(Resize(R), CenterCrop(C), ToTensor, ImageNet Normalize), the same number of decoding
workers (--decode_threads for recal-run, DataLoader num_workers in Python) and of intra-op
threads, and recalibrate the same resnet18 archive over every image. Runs alternate after
one untimed warm-up of each (which also warms the page cache); the table shows median and
min wall seconds and the ratio.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.path.join(os.path.dirname(_HERE), ".venv", "bin", "python")  # scripts/venv.sh
MEAN, STD = "0.485,0.456,0.406", "0.229,0.224,0.225"


def timed(cmd):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit("image_folder_compare: %s failed (%d):\n%s" % (cmd[0], p.returncode, p.stderr.decode()[-2000:]))
    return dt, p.stdout.decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True, help="resnet18 TorchScript archive (tests/fixtures/models.py)")
    ap.add_argument("--folder", required=True)
    ap.add_argument("--resize", type=int, default=128)
    ap.add_argument("--crop", type=int, default=112)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        spec = "images:%s?resize=%d&crop=%d&mean=%s&std=%s" % (args.folder, args.resize, args.crop, MEAN, STD)
        recal = [args.bin, "--model", args.model, "--data", spec, "--batch_size", str(args.batch_size),
                 "--out", os.path.join(tmp, "out.pt"), "--report", os.path.join(tmp, "report.json"),
                 "--max_batches", "100000", "--allow_short_data",
                 "--decode_threads", str(args.workers), "--threads", str(args.threads)]
        python = [PYTHON, os.path.join(_HERE, "torchvision_precise_bn.py"), "--model", args.model,
                  "--folder", args.folder, "--resize", str(args.resize), "--crop", str(args.crop),
                  "--batch_size", str(args.batch_size), "--workers", str(args.workers),
                  "--threads", str(args.threads), "--no_decode_only"]
        timed(recal)
        timed(python)
        times = {"recal": [], "python": []}
        job = []
        for _ in range(args.repeats):
            times["recal"].append(timed(recal)[0])
            dt, out = timed(python)
            times["python"].append(dt)
            job.append(json.loads(out.strip().splitlines()[-1])["job_s"])
        with open(os.path.join(tmp, "report.json")) as f:
            images = int(json.load(f)["samples"])

    med = {k: statistics.median(v) for k, v in times.items()}
    print("recalibration over %d images (resize %d, crop %d, batch %d), %d decoding workers, %d intra-op "
          "threads, whole process, %d runs" % (images, args.resize, args.crop, args.batch_size, args.workers,
                                               args.threads, args.repeats))
    print("%-52s %10s %10s %12s" % ("", "median s", "min s", "images/s"))
    print("%-52s %10.2f %10.2f %12.1f" % ("recal-run (images: spec)", med["recal"], min(times["recal"]),
                                          images / med["recal"]))
    print("%-52s %10.2f %10.2f %12.1f" % ("torchvision ImageFolder+DataLoader, fvcore precise BN",
                                          med["python"], min(times["python"]), images / med["python"]))
    print("  (of which the job itself, without imports and model build: median %.2f s)" % statistics.median(job))
    print("ratio recal-run / torchvision: %.2f" % (med["recal"] / med["python"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
