#!/usr/bin/env python3
"""Shows what the demo produced: the report's headline numbers, and the recalibrated program
loaded in Python (torch.export.load) and compared with the float64 reference."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
import reference as reference_metric  # noqa: E402
import safetensors_io  # noqa: E402

out, fixtures = sys.argv[1], sys.argv[2]
report = json.load(open(os.path.join(out, "resnet18.report.json")))
print(f"report: {report['layers_recalibrated']} layers from {report['batches']} batches "
      f"({report['samples']} samples), unused: {report['unused_layers'] or 'none'}")
for layer in report["layers"][:3]:
    print(f"  {layer['name']:<16} channels {layer['channels']:>4}  "
          f"var new/old median {layer['var_ratio']['median']:.3f}  "
          f"mean shift median {layer['mean_shift_in_std']['median']:.3f} std")
program = torch.export.load(os.path.join(out, "resnet18.recalibrated.pt2"))
reference = safetensors_io.load(os.path.join(fixtures, "ref", "resnet18.population.safetensors"))
worst = reference_metric.worst_error(dict(program.state_dict), reference)
print(f"recalibrated model loads in Python; worst difference from the float64 reference: "
      f"{worst:.3f} of the 1e-5 tolerance over {len(reference)} buffers")
sys.exit(0 if worst <= 1.0 else 1)
