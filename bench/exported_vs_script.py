#!/usr/bin/env -S sh -c 'exec "$(dirname "$0")/../.venv/bin/python" "$0" "$@"'
"""The exported-program path against the TorchScript path on the same model: one eager
model (bench/python_baselines.py's builders) saved both ways in eval mode —
torch.export.export (batch dimension dynamic) + torch.export.save, and torch.jit.script +
torch.jit.save — and recalibrated by the same recal-run on the same npy data.

    .venv/bin/python bench/exported_vs_script.py [--bin build/bin/recal-run] [--threads 2]
        [--families resnet18,mobilenet_v2,resnet50] [--batches 20] [--batch_size 32]
        [--size 112] [--repeats 5]

After one untimed warm-up of each, --repeats rounds run the two back to back (the order
alternating), so drift on a shared machine hits a round's pair alike. Printed per family:
the medians of per-round ratios exported / TorchScript of the whole process's wall seconds,
and of the engine's own forward-and-accumulate seconds (the report's `seconds`: loading and
writing left out), and how far apart the two runs' statistics are (the two paths run the
same kernels in the same order, so they should agree to the last bits).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import warnings

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "tests", "fixtures"))

import baselines_compare  # noqa: E402  (make_data, timed)

SIDES = ("exported", "torchscript")


def save_both(tmp, family, size):
    """{side: archive path} of one eval-mode model."""
    import torch

    import python_baselines

    model = python_baselines.build_eager(family).eval()
    paths = {"exported": os.path.join(tmp, family + ".pt2"), "torchscript": os.path.join(tmp, family + ".pt")}
    example = (torch.randn(2, 3, size, size),)
    program = torch.export.export(model, example, dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    torch.export.save(program, paths["exported"])
    with warnings.catch_warnings():  # torch.jit is deprecated: this is the path being compared against
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(model), paths["torchscript"])
    return paths


def compare(args, tmp, family, data):
    import safetensors_io

    archives = save_both(tmp, family, args.size)
    cmds = {}
    for side in SIDES:
        cmds[side] = [args.bin, "--model", archives[side], "--data", "npy:" + data, "--batch_size",
                      str(args.batch_size), "--max_batches", str(args.batches), "--threads", str(args.threads),
                      "--out", os.path.join(tmp, "out." + side), "--bn_out", os.path.join(tmp, side + ".safetensors"),
                      "--report", os.path.join(tmp, side + ".json")]
    for side in SIDES:
        baselines_compare.timed(cmds[side])
    wall = {side: [] for side in SIDES}
    engine = {side: [] for side in SIDES}
    for r in range(args.repeats):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            dt, _ = baselines_compare.timed(cmds[side])
            wall[side].append(dt)
            with open(os.path.join(tmp, side + ".json")) as f:
                engine[side].append(float(json.load(f)["seconds"]))
    stats = {side: safetensors_io.load(os.path.join(tmp, side + ".safetensors")) for side in SIDES}
    apart = max(float(((stats["exported"][k].double() - v.double()).abs() / v.double().abs().clamp_min(1e-12)).max())
                for k, v in stats["torchscript"].items())
    ratio = {what: statistics.median(a / b for a, b in zip(d["exported"], d["torchscript"]))
             for what, d in (("wall", wall), ("engine", engine))}
    print("| %s | %.2f | %.2f | **%.3f** | %.3f | %.3f | %.2g |" % (
        family, statistics.median(wall["exported"]), statistics.median(wall["torchscript"]), ratio["wall"],
        statistics.median(engine["exported"]), statistics.median(engine["torchscript"]), apart), flush=True)
    return ratio


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(_HERE), "build", "bin", "recal-run"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--families", default="resnet18,mobilenet_v2,resnet50")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="recal-exported-bench-")
    try:
        data = os.path.join(tmp, "data.npy")
        baselines_compare.make_data(data, args.batches, args.batch_size, args.size)
        print("exported program vs TorchScript, same eval-mode model and data: %d batches of %dx3x%dx%d, "
              "%d threads, %d rounds (medians of per-round ratios)" % (
                  args.batches, args.batch_size, args.size, args.size, args.threads, args.repeats))
        print("| family | exported s | TorchScript s | exported / TorchScript (wall) | engine s exported | "
              "engine s TorchScript | max rel diff of statistics |")
        print("|---|---|---|---|---|---|---|")
        for family in args.families.split(","):
            compare(args, tmp, family, data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
