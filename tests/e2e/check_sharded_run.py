#!/usr/bin/env python3
"""Sharded recalibration (`recal-run --shards K`) against the unsharded run and the float64
reference, on real fixture models and files:

    .venv/bin/python tests/e2e/check_sharded_run.py --bin build/bin/recal-run [--keep]

For every family below, data whose last batch is partial (a batch of one sample for the
last_single families), and K = 1, 2, 3, 4:
  - float32 model and data: the buffers match the float64 reference (the agreed metric,
    1e-5), and the report counts the same batches, samples and calls as the unsharded run;
  - the same model in float64 (buffers and data float64, so that nothing is lost to
    float32 rounding): the buffers equal the unsharded run's to 1e-9 relative, and the
    reference to 1e-5.
The same as torch.export programs (float64) for a few families: K = 2, 3 equal K = 1 to
1e-9 and the reference to 1e-5. And an image folder (JPEG and PNG, last batch partial) through a float64 ResNet-18: K = 2, 3
equal K = 1 to 1e-9 and the reference on torchvision's tensors to 1e-5. target_rel_error
across K = 1, 2, 4 shards: met by the merged statistics, from about as many batches. And the
refusals: more shards than batches, --shards 0.

Prints `N passed, M failed` and exits 1 if anything failed.
"""

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, os.path.join(_ROOT, "tests", "fixtures"))
sys.path.insert(0, _HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import check_image_folder as images  # noqa: E402
import models  # noqa: E402
import reference  # noqa: E402
import safetensors_io  # noqa: E402

# family -> samples (batch size from the fixtures): at least 4 batches, the last one partial.
FAMILIES = {
    "resnet18": 29,
    "functional": 35,
    "bn1d_2d": 35,
    "twice": 35,
    "two_input": 35,
    "ill_conditioned": 43,
    "last_single_1d": 33,
    "last_single_pooled": 33,
    "masked_rows": 40,  # rows selected only in batches 0 and 1: later calls see none
}
# Families also run as torch.export programs (float64).
EXPORTED_FAMILIES = ("resnet18", "twice", "two_input", "last_single_1d")
SHARDS = (1, 2, 3, 4)
MERGE_RTOL = 1e-9


def export(eager, example):
    try:
        return torch.jit.script(eager)
    except Exception:  # noqa: BLE001  (families written for tracing)
        return torch.jit.trace(eager, example, check_trace=False)


def save_data(path_base, inputs, keys=None):
    """npy for one input, safetensors for several; returns the data spec."""
    if len(inputs) == 1:
        np.save(path_base + ".npy", inputs[0].numpy())
        return "npy:" + path_base + ".npy"
    keys = keys or ["in%d" % i for i in range(len(inputs))]
    safetensors_io.save(dict(zip(keys, inputs)), path_base + ".safetensors")
    return "safetensors:%s.safetensors:%s" % (path_base, ",".join(keys))


def run(binary, args, timeout=300):
    p = subprocess.run([binary] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                       timeout=timeout)
    return p.returncode, p.stderr.decode("utf-8", "replace")


def stats_of(path):
    return {k: v.double() for k, v in safetensors_io.load(path).items()}


def worst(got, ref, rtol):
    """Worst error over every running_mean/var pair of `ref`, in units of rtol (<= 1 passes)."""
    return reference.worst_error(got, ref, rtol)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="path to recal-run")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="recal-shards-")
    failures = []
    passed = [0]

    def check(ok, what):
        print("%s %s" % ("ok  " if ok else "FAIL", what), flush=True)
        if ok:
            passed[0] += 1
        else:
            failures.append(what)
        return ok

    def recal(tag, model, data, batch_size, shards, extra=()):
        d = os.path.join(work, tag)
        os.makedirs(d)
        # recal-run refuses a PT2 result under a TorchScript name.
        out = dict(out=os.path.join(d, "out.pt2" if model.endswith(".pt2") else "out.pt"), bn=os.path.join(d, "bn.safetensors"),
                   report=os.path.join(d, "report.json"))
        rc, err = run(binary, ["--model", model, "--data", data, "--batch_size", str(batch_size),
                               "--shards", str(shards), "--threads", "1", "--out", out["out"], "--bn_out", out["bn"],
                               "--report", out["report"]] + list(extra))
        out["rc"], out["err"] = rc, err.strip().splitlines()[-1] if err.strip() else ""
        if "Sanitizer" in err:  # a sanitizer build's report: the last line alone says nothing
            print(err, flush=True)
        if rc == 0:
            with open(out["report"]) as f:
                out["rep"] = json.load(f)
        return out

    try:
        t0 = time.time()
        for family, samples in FAMILIES.items():
            eager, example = models.build(family)
            inputs, batch_size = models.make_data(family, samples=samples)
            keys = models.SPECS[family].get("keys")
            for precision in ("float32", "float64"):
                m = copy.deepcopy(eager)
                xs = inputs
                if precision == "float64":
                    m = m.double()
                    xs = [x.double() for x in inputs]
                base = os.path.join(work, "%s_%s" % (family, precision))
                model_path = base + ".pt"
                torch.jit.save(export(m, tuple(x.to(xs[0].dtype) for x in example)), model_path)
                data = save_data(base, xs, keys)
                batches = models.make_batches(xs, batch_size)
                ref = reference.reference_stats(copy.deepcopy(m), batches, "population", family)
                results = {}
                for k in SHARDS:
                    r = recal("%s_%s_k%d" % (family, precision, k), model_path, data, batch_size, k)
                    if not check(r["rc"] == 0, "%s %s K=%d runs (%s)" % (family, precision, k, r["err"])):
                        continue
                    got = stats_of(r["bn"])
                    results[k] = (got, r["rep"])
                    e = worst(got, ref, models.rtol(family))
                    check(e <= 1.0, "%s %s K=%d vs float64 reference: %.2g of 1e-5" % (family, precision, k, e))
                    check(int(r["rep"]["batches"]) == len(batches) and int(r["rep"]["samples"]) == samples
                          and int(r["rep"].get("shards", 1)) == k,
                          "%s %s K=%d report: %s batches, %s samples, %s shards (want %d, %d, %d)"
                          % (family, precision, k, r["rep"]["batches"], r["rep"]["samples"], r["rep"].get("shards"),
                             len(batches), samples, k))
                if 1 not in results:
                    continue
                one, one_rep = results[1]
                for k in SHARDS[1:]:
                    if k not in results:
                        continue
                    got, rep = results[k]
                    calls = {l["name"]: (l["calls"], l["samples"]) for l in rep["layers"]}
                    one_calls = {l["name"]: (l["calls"], l["samples"]) for l in one_rep["layers"]}
                    check(calls == one_calls, "%s %s K=%d: every layer's calls and samples as unsharded"
                          % (family, precision, k))
                    if precision == "float64":
                        e = worst(got, one, MERGE_RTOL)
                        check(e <= 1.0, "%s float64 K=%d vs K=1: %.2g of 1e-9" % (family, k, e))
            print("  %s done (%.1fs)" % (family, time.time() - t0), flush=True)

        # ---- torch.export programs in float64: K = 2, 3 equal K = 1 to 1e-9, and the reference.
        for family in EXPORTED_FAMILIES:
            eager, example = models.build(family)
            inputs, batch_size = models.make_data(family, samples=FAMILIES[family])
            m = copy.deepcopy(eager).double()
            xs = [x.double() for x in inputs]
            base = os.path.join(work, "%s_exported" % family)
            batch = torch.export.Dim("batch", min=1)
            program = torch.export.export(m, tuple(x.double() for x in example),
                                          dynamic_shapes=tuple({0: batch} for _ in example))
            torch.export.save(program, base + ".pt2")
            data = save_data(base, xs, models.SPECS[family].get("keys"))
            ref = reference.reference_stats(copy.deepcopy(m), models.make_batches(xs, batch_size), "population",
                                            family)
            results = {}
            for k in (1, 2, 3):
                r = recal("%s_exported_k%d" % (family, k), base + ".pt2", data, batch_size, k)
                if check(r["rc"] == 0, "%s exported K=%d runs (%s)" % (family, k, r["err"])):
                    results[k] = stats_of(r["bn"])
                    e = worst(results[k], ref, models.rtol(family))
                    check(e <= 1.0, "%s exported K=%d vs float64 reference: %.2g of 1e-5" % (family, k, e))
            for k in (2, 3):
                if 1 in results and k in results:
                    e = worst(results[k], results[1], MERGE_RTOL)
                    check(e <= 1.0, "%s exported float64 K=%d vs K=1: %.2g of 1e-9" % (family, k, e))
        print("  exported programs done (%.1fs)" % (time.time() - t0), flush=True)

        # ---- an image folder, JPEG and PNG, through a float64 ResNet-18.
        root = os.path.join(work, "imgs_all")
        images.make_folder(root)
        rels = images.list_images(root)
        crops = images.torchvision_crops(root, rels)
        good = [r for r in rels if crops[r] is not None]
        clean = os.path.join(work, "imgs")
        for rel in good:
            os.makedirs(os.path.dirname(os.path.join(clean, rel)), exist_ok=True)
            shutil.copy(os.path.join(root, rel), os.path.join(clean, rel))
        tensors = [images.to_tensor(crops[r]) for r in good]
        batch = 10  # 43 images: 4 full batches and a partial one of 3

        class Float64(nn.Module):
            def __init__(self, net):
                super().__init__()
                self.net = net

            def forward(self, x):
                return self.net(x.double())

        net, _ = models.build("resnet18")
        wrapped = Float64(net.double()).eval()
        model_path = os.path.join(work, "resnet18_f64_images.pt")
        torch.jit.save(torch.jit.script(copy.deepcopy(wrapped)), model_path)
        ref = reference.reference_stats(copy.deepcopy(wrapped), images.batches_of(tensors, batch), "population",
                                        "resnet18")
        spec = "images:%s?resize=%d&crop=%d&mean=%s&std=%s" % (
            clean, images.RESIZE, images.CROP, ",".join(map(str, images.MEAN)), ",".join(map(str, images.STD)))
        image_runs = {}
        for k in (1, 2, 3):
            r = recal("images_k%d" % k, model_path, spec, batch, k, ["--decode_threads", "1"])
            if check(r["rc"] == 0, "images K=%d runs (%s)" % (k, r["err"])):
                image_runs[k] = stats_of(r["bn"])
                e = worst(image_runs[k], ref, models.DEFAULT_RTOL)
                check(e <= 1.0, "images K=%d vs float64 reference on torchvision's tensors: %.2g of 1e-5" % (k, e))
        for k in (2, 3):
            if 1 in image_runs and k in image_runs:
                e = worst(image_runs[k], image_runs[1], MERGE_RTOL)
                check(e <= 1.0, "images K=%d vs K=1: %.2g of 1e-9" % (k, e))

        # ---- target_rel_error across shards: each shard aims at E*sqrt(K); the merged
        # statistics meet E, from about as many batches as one run needs.
        model_path = os.path.join(work, "target.pt")
        eager, example = models.build("bn1d_2d")
        torch.jit.save(export(eager, example), model_path)
        used = {}
        for k in (1, 2, 4):
            r = recal("target_k%d" % k, model_path, "synthetic:12,seed=3", 16, k, ["--target_rel_error", "0.05"])
            if not check(r["rc"] == 0, "target_rel_error K=%d runs (%s)" % (k, r["err"])):
                continue
            rel = max(float(l.get("rel_std_error", 0)) for l in r["rep"]["layers"])
            used[k] = int(r["rep"]["batches"])
            check(r["rep"].get("stopped_early") and 0 < rel <= 0.05,
                  "target_rel_error 0.05, K=%d: stopped early after %d batches, merged error %.4f"
                  % (k, used[k], rel))
        if 1 in used:
            for k in (2, 4):
                if k in used:
                    check(used[k] <= 1.5 * used[1], "K=%d used %d batches, one run %d" % (k, used[k], used[1]))

        # ---- refusals: a clear reason, no output.
        eager, example = models.build("bn1d_2d")
        inputs, _ = models.make_data("bn1d_2d", samples=20)
        model_path = os.path.join(work, "refuse.pt")
        torch.jit.save(export(eager, example), model_path)
        data = save_data(os.path.join(work, "refuse"), inputs)
        r = recal("too_many", model_path, data, 8, 4)
        check(r["rc"] != 0 and "fewer than its 4 shards" in r["err"] and not os.path.exists(r["out"]),
              "3 batches in 4 shards refused: %s" % r["err"])
        r = recal("zero", model_path, data, 8, 0)
        check(r["rc"] != 0 and "--shards" in r["err"] and not os.path.exists(r["out"]),
              "--shards 0 refused: %s" % r["err"])
    finally:
        if args.keep:
            print("work directory kept: %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed[0], len(failures)))
    for f in failures:
        print("  FAILED: %s" % f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
