#!/usr/bin/python3
"""Shows what the demo produced: the report's headline numbers, and the recalibrated model
loaded in Python and compared with the float64 reference."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
import safetensors_io  # noqa: E402

out, fixtures = sys.argv[1], sys.argv[2]
report = json.load(open(os.path.join(out, "resnet18.report.json")))
print(f"report: {report['layers_recalibrated']} layers from {report['batches']} batches "
      f"({report['samples']} samples), unused: {report['unused_layers'] or 'none'}")
for layer in report["layers"][:3]:
    print(f"  {layer['name']:<16} channels {layer['channels']:>4}  "
          f"var new/old median {layer['var_ratio']['median']:.3f}  "
          f"mean shift median {layer['mean_shift_in_std']['median']:.3f} std")
model = torch.jit.load(os.path.join(out, "resnet18.recalibrated.pt"))
reference = safetensors_io.load(os.path.join(fixtures, "ref", "resnet18.population.safetensors"))
buffers = dict(model.named_buffers())
worst = 0.0
for key, ref in reference.items():
    ref = torch.as_tensor(ref, dtype=torch.float64)
    got = buffers[key].double()
    scale = ref.abs() if key.endswith("var") else torch.maximum(
        ref.abs(), torch.as_tensor(reference[key[: -len("mean")] + "var"]).double().sqrt())
    worst = max(worst, ((got - ref).abs() / (scale + 1e-12)).max().item())
print(f"recalibrated model loads in Python; worst relative difference from the float64 "
      f"reference over {len(reference)} buffers: {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
