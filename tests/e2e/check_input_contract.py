#!/usr/bin/env python3
"""recal-run against programs' input contracts (tests/fixtures/contract_programs.py): data a
program was not exported for is refused before any batch runs, in one stderr line that names
the data, the input, the dimension, what the data gives, what the program was exported for
and the fix; batches only the reading can tell (torch: files) are refused at the batch; a
float64 file for a float32 program is cast and said so; --out must not name a PT2 result
.pt, nor a TorchScript one .pt2.

    .venv/bin/python tests/e2e/check_input_contract.py --bin build/bin/recal-run \
        --programs build/contract_programs

Prints `N passed, M failed` and exits 1 if anything failed.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--programs", required=True)
    args = ap.parse_args()
    programs = os.path.abspath(args.programs)
    data = os.path.join(programs, "data")
    work = tempfile.mkdtemp(prefix="recal-contract-")
    # 10 samples of 3x8x8 for the static batch of 4; the same 3x16x16 samples as a torch: file.
    np.save(os.path.join(work, "x8.npy"), np.random.default_rng(0).standard_normal((10, 3, 8, 8)).astype(np.float32))
    torch.save(torch.from_numpy(np.load(os.path.join(data, "x16.npy"))), os.path.join(work, "x16.pt"))
    passed, failed = [0], []

    def run(tag, model, spec, out=None, extra=(), ok=False, says=(), batch_size=4):
        out = os.path.join(work, out or (tag + (".pt2" if model.endswith(".pt2") else ".pt")))
        cmd = [args.bin, "--model", os.path.join(programs, model), "--data", spec, "--out", out,
               "--batch_size", str(batch_size), "--threads", "1"] + list(extra)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        lines = [line for line in p.stderr.splitlines() if line.strip()]
        errors = []
        if (p.returncode == 0) != ok:
            errors.append("exited %d" % p.returncode)
        if not ok:
            if os.path.exists(out):
                errors.append("wrote %s" % out)
            if any(" batch " in line and "/" in line for line in lines[:-1]):
                errors.append("ran batches before refusing")
        text = lines[-1] if lines and not ok else p.stderr
        errors += ["stderr lacks %r" % s for s in says if s not in text]
        if errors:
            failed.append(tag)
            print("FAIL %s: %s\n     %s" % (tag, "; ".join(errors), p.stderr.strip().replace("\n", "\n     ")), flush=True)
        else:
            passed[0] += 1
            print("ok   %s" % tag, flush=True)

    npy = lambda name: "npy:" + os.path.join(data, name)  # noqa: E731
    run("static_resolution", "static32.pt2", npy("x16.npy"),
        says=["recal-run: the data npy:", "does not fit the model: input 'x' dim 2 is 16, but the program was "
              "exported for exactly 32", "the data gives 4x3x16x16 float32", "resize or crop"])
    run("channels", "static32.pt2", "synthetic:4x32x32",
        says=["input 'x' dim 1 is 4, but the program was exported for exactly 3"])
    run("fits", "static32.pt2", npy("x32.npy"), ok=True, says=["recalibrated 1 BatchNorm layers"])
    run("bounded_range", "bounded.pt2", "synthetic:3x64x64", extra=["--max_batches", "2"],
        says=["input 'x' dim 2 is 64, but the program was exported for a torch.export.Dim there", ": 16..48)"])
    run("bounded_equal", "bounded.pt2", "synthetic:3x16x24", extra=["--max_batches", "2"],
        says=["input 'x' dim 3 is 24, but the program was exported with it equal to input 'x' dim 2, which is 16"])
    run("bounded_fits", "bounded.pt2", npy("x16.npy"), ok=True)
    run("static_batch", "static_batch.pt2", "npy:" + os.path.join(work, "x8.npy"), batch_size=8,
        says=["input 'x' dim 0 (the batch) is 8, but the program was exported for batches of exactly 4",
              "batch_size 4"])
    run("static_batch_last", "static_batch.pt2", "npy:" + os.path.join(work, "x8.npy"),
        says=["the last batch holds 2 of the data's 10 samples (batches of 4)"])
    run("static_batch_without_last", "static_batch.pt2", "npy:" + os.path.join(work, "x8.npy"),
        extra=["--max_batches", "2"], ok=True)
    run("int64_file", "static32.pt2", npy("x32_int64.npy"),
        says=["input 'x' is int64, but the program takes float32", "scale=255", "x.astype(np.float32)"])
    run("float64_file", "static32.pt2", npy("x32_float64.npy"), ok=True,
        says=["input 'x': float64 data is cast to float32"])
    run("torch_file_at_its_batch", "static32.pt2", "torch:" + os.path.join(work, "x16.pt"),
        says=["batch 0: input 'x' dim 2 is 16, but the program was exported for exactly 32"])
    run("torchscript_counts", "static32.pt", "synthetic:3x16x16", extra=["--max_batches", "1"], ok=True)
    run("out_pt_for_pt2", "static32.pt2", npy("x32.npy"), out="result.pt",
        says=["--out", "result.pt: the model is a torch.export program", "name it", "result.pt2"])
    run("out_pt2_for_torchscript", "static32.pt", npy("x32.npy"), out="result.pt2",
        says=["the model is TorchScript", "result.pt"])
    print("%d passed, %d failed" % (passed[0], len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
