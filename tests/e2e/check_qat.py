#!/usr/bin/env python3
"""Deep quantization-aware torchvision models through `recal-run`: exact against a float32
emulation of the engine's forward, and within the quantization cascade of the float64
reference.

    .venv/bin/python tests/e2e/check_qat.py --bin build/bin/recal-run [--families a,b] [--keep DIR]

For each of tests/fixtures/models.py's DEEP_QAT_FAMILIES (torchvision's ResNet-18 through
torchao's pt2e QAT with the XNNPACK quantizer, MobileNetV2 with the X86 one; observers trained,
stored statistics off, as models.build makes them) the train-mode program is exported and
run through recal-run (--threads 1, contiguous) on the family's data, and its statistics are
compared with
  emulation  the GraphModule in eval mode, quantizers frozen, every BatchNorm through the
             float32 fused kernel as the engine calls it, merged in float64
             (reference.emulate_engine, one thread): the same float32 activations, so the
             agreed metric at rtol 1e-5 must hold;
  reference  the float64 reference (reference.reference_all): a float32 rounding that flips
             one quantization step cascades through the layers after it, so each layer must
             be within 3 times the emulation's own distance from it, plus the tolerance.
Also: every buffer of the result but the running statistics equals the upload's (observers'
ranges, scales, zero points), and the report counts the quantizers, all frozen. Prints one
line per family with the worst errors (in units of rtol 1e-5) and exits 1 on a failure.
"""

import argparse
import copy
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

import models  # noqa: E402
import qat  # noqa: E402
import reference  # noqa: E402
import safetensors_io  # noqa: E402

RTOL = 1e-5


def layer_worst(got, ref, pairs):
    """{layer: worst error in units of RTOL} of `got` against `ref`."""
    return {name: max(reference.stats_close(got, ref, mk, vk, RTOL)[1:]) for name, mk, vk in pairs}


def frozen_graph(model):
    """The model as the emulation runs it: eval mode, observers off, BatchNorm via F.batch_norm."""
    model = copy.deepcopy(model).eval()
    qat.freeze_observers(model)
    return qat.route_batch_norms(model)


def run_family(family, binary, work):
    errors = []
    model, example = models.build(family)
    inputs, batch_size = models.make_data(family)
    batches = models.make_batches(inputs, batch_size)
    program = os.path.join(work, family + ".pt2")
    model.train()
    torch.export.save(torch.export.export(copy.deepcopy(model), example,
                                          dynamic_shapes=({0: torch.export.Dim("batch", min=1)},)), program)
    data = os.path.join(work, family + ".npy")
    np.save(data, inputs[0].numpy())
    out, bn, report = (os.path.join(work, family + suffix) for suffix in (".out.pt2", ".bn.safetensors", ".json"))
    subprocess.run([binary, "--model", program, "--data", "npy:" + data, "--batch_size", str(batch_size),
                    "--threads", "1", "--memory_format", "contiguous", "--out", out, "--bn_out", bn,
                    "--report", report], check=True, capture_output=True)
    got = safetensors_io.load(bn)
    pairs = models.bn_buffer_pairs(model, family)
    torch.set_num_threads(1)
    emulated = layer_worst(got, reference.emulate_engine(frozen_graph(model), batches, family), pairs)
    ref = reference.reference_all(copy.deepcopy(model), batches, family)[0]["population"]
    against_ref = layer_worst(got, ref, pairs)
    cascade = layer_worst(reference.emulate_engine(frozen_graph(model), batches, family), ref, pairs)
    for name, _, _ in pairs:
        if not emulated[name] <= 1.0:
            errors.append("%s %s: %.3g x rtol from the float32 emulation" % (family, name, emulated[name]))
        if not against_ref[name] <= 3 * cascade[name] + 1.0:
            errors.append("%s %s: %.3g x rtol from the reference, the emulation %.3g" % (
                family, name, against_ref[name], cascade[name]))
    uploaded, result = torch.export.load(program).state_dict, torch.export.load(out).state_dict
    for key, value in uploaded.items():
        if not key.endswith(("running_mean", "running_var")) and not torch.equal(result[key], value):
            errors.append("%s: the result changed %s" % (family, key))
    with open(report) as f:
        quantizers = json.load(f).get("quantizers", {})
    if not quantizers.get("count") or quantizers.get("observers_frozen") != quantizers.get("count"):
        errors.append("%s: report quantizers %s" % (family, quantizers))
    print("%-24s %2d layers  worst x rtol: emulation %.3g, reference %.3g (the emulation's own %.3g)  "
          "quantizers %s" % (family, len(pairs), max(emulated.values()), max(against_ref.values()),
                             max(cascade.values()), quantizers.get("count")), flush=True)
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="recal-run")
    ap.add_argument("--families", default=",".join(models.DEEP_QAT_FAMILIES))
    ap.add_argument("--keep", default="", help="keep the programs and results here")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="recal-check-qat-")
    os.makedirs(work, exist_ok=True)
    errors = []
    try:
        for family in args.families.split(","):
            errors += run_family(family, args.bin, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for error in errors:
        print("FAIL " + error)
    print("check_qat: %s" % ("passed" if not errors else "%d FAILED" % len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
