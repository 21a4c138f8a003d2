#!/usr/bin/env -S sh -c 'exec "$(dirname "$0")/../.venv/bin/python" "$0" "$@"'
"""recal-run against the Python baselines users run today — fvcore's own update_bn_stats
(the PyPI package) and torch.optim.swa_utils.update_bn — whole process against whole
process, on the same torch (recal-run links the venv's LibTorch); and the recalibration
against a plain train-mode forward in one process.

    .venv/bin/python bench/baselines_compare.py [--bin build/bin/recal-run] [--threads 2]
        [--families resnet18,mobilenet_v2,resnet50] [--batches 20] [--batch_size 32]
        [--size 112] [--repeats 5] [--overhead_reps 5] [--keep]

For each family (tests/fixtures/models.py's resnet18 and mobilenet_v2; resnet50 from
bench/python_baselines.py) one seeded eager model gives a TorchScript archive (scripted,
eval mode) for recal-run and its state_dict for the Python sides, and every side reads the
same npy data (--batches batches of --batch_size x 3 x --size x --size float32) with the
same intra-op thread count:
  fvcore     .venv/bin/python bench/python_baselines.py --method fvcore (update_bn_stats),
  update_bn  .venv/bin/python bench/python_baselines.py --method update_bn,
  recal-run  recal-run --model ARCHIVE --data npy:... --batch_size B --max_batches N
             --threads T --out ... --bn_out ... --report ...
After one untimed warm-up of each, --repeats rounds run the three back to back (the order
rotating each round), so drift on a shared machine hits a round's three alike; the ratios
are medians of the per-round ratios, of wall seconds and, less sensitive to what else
runs on the machine, of each process's CPU seconds (user + system). The statistics are checked against a float64
reference (tests/fixtures/reference.py): each side against the estimator it implements
(population for recal-run and fvcore, batch_average for update_bn), in units of the agreed
tolerance (rtol 1e-5: at most 1 passes). Then build/bin/recalibration_overhead gives, in
one process, interleaved, the recalibration over the plain train-mode forward
(--overhead_reps 0 skips it). First, the process start of each side alone.
"""

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path.insert(0, os.path.join(_ROOT, "tests", "fixtures"))
sys.path.insert(0, _HERE)

PYTHON = os.path.join(_ROOT, ".venv", "bin", "python")
SIDES = ("fvcore", "update_bn", "recal-run")
ESTIMATOR = {"fvcore": "population", "update_bn": "batch_average", "recal-run": "population"}


# ---------------------------------------------------------------------------- inputs


def make_data(path, batches, batch_size, size):
    """Seeded float32 npy of batches * batch_size samples, written in chunks."""
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(1234)
    n = batches * batch_size
    arr = np.lib.format.open_memmap(path, mode="w+", dtype="<f4", shape=(n, 3, size, size))
    for start in range(0, n, batch_size):
        arr[start : start + batch_size] = torch.randn((batch_size, 3, size, size), generator=g).numpy()
    arr.flush()


def make_model(tmp, family):
    """(eager model, TorchScript archive path, state_dict path): one module, two files."""
    import torch

    import python_baselines

    model = python_baselines.build_eager(family)
    archive = os.path.join(tmp, "%s.scripted_eval.pt" % family)
    with warnings.catch_warnings():  # torch.jit.script/save are deprecated: recal-run reads TorchScript
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(model), archive)
    weights = os.path.join(tmp, "%s.state_dict.pt" % family)
    torch.save(model.state_dict(), weights)
    return model, archive, weights


def side_commands(args, binary, family, archive, weights, data, tmp):
    """{side: (argv, file holding its new statistics)}."""
    common = ["--data", "npy:" + data, "--batch_size", str(args.batch_size), "--threads", str(args.threads)]
    cmds = {}
    for method in ("fvcore", "update_bn"):
        out = os.path.join(tmp, "%s.%s.pt" % (family, method))
        cmds[method] = ([PYTHON, os.path.join(_HERE, "python_baselines.py"), "--method", method, "--family", family,
                         "--weights", weights, "--batches", str(args.batches), "--out", out] + common, out)
    bn_out = os.path.join(tmp, "%s.bn.safetensors" % family)
    cmds["recal-run"] = ([binary, "--model", archive, "--out", os.path.join(tmp, "%s.recal.pt" % family),
                          "--bn_out", bn_out, "--report", os.path.join(tmp, "report.json"),
                          "--max_batches", str(args.batches)] + common, bn_out)
    return cmds


# ---------------------------------------------------------------------------- timing


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, cpu=None):
    """(wall seconds of the whole process, its stdout); exits on failure. Appends the
    process's CPU seconds (user + system, all its threads) to the list `cpu` if given."""
    c0, t0 = children_cpu(), time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if cpu is not None:
        cpu.append(children_cpu() - c0)
    if p.returncode != 0:
        raise SystemExit("command failed (exit %d): %s\n%s" % (p.returncode, " ".join(cmd),
                                                               p.stderr.decode("utf-8", "replace")[-2000:]))
    return dt, p.stdout.decode("utf-8", "replace")


def run_interleaved(cmds, repeats):
    """One untimed warm-up of each side, then `repeats` rounds of all sides back to back,
    the order rotating each round. Returns ({side: [wall s]}, {side: [CPU s]},
    {side: [stdout]})."""
    for side in SIDES:
        timed(cmds[side][0])
    times, cpu, outs = ({side: [] for side in SIDES} for _ in range(3))
    for r in range(repeats):
        for side in SIDES[r % len(SIDES):] + SIDES[: r % len(SIDES)]:
            dt, out = timed(cmds[side][0], cpu[side])
            times[side].append(dt)
            outs[side].append(out)
    return times, cpu, outs


def pair_ratio(times, num, den):
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def recal_over_forward(binary, archive, args):
    """recalibration_overhead's median ratio recalibration / plain train-mode forward."""
    _, out = timed([binary, "--model", archive, "--batch_size", str(args.batch_size),
                    "--shape", "3x%dx%d" % (args.size, args.size), "--batches", str(args.overhead_batches),
                    "--reps", str(args.overhead_reps), "--threads", str(args.threads)])
    m = re.search(r"median ratio recalibration / plain forward: ([0-9.]+)", out)
    if not m:
        raise SystemExit("recalibration_overhead printed no median ratio:\n" + out)
    return float(m.group(1))


# ---------------------------------------------------------------------------- statistics


def load_stats(side, path):
    import torch

    import safetensors_io

    return safetensors_io.load(path) if side == "recal-run" else torch.load(path, weights_only=True)


def stats_errors(model, data, args, outputs):
    """{side: worst error against the float64 reference of its estimator, in units of the
    agreed tolerance}, and the worst relative difference recal-run vs fvcore."""
    import copy

    import numpy as np
    import torch

    import reference

    arr = np.load(data, mmap_mode="r")
    batches = [(torch.from_numpy(np.array(arr[s : s + args.batch_size])),)
               for s in range(0, args.batches * args.batch_size, args.batch_size)]
    refs = reference.reference_all(copy.deepcopy(model), batches)[0]
    stats = {side: load_stats(side, path) for side, path in outputs.items()}
    errors = {side: reference.worst_error(stats[side], refs[ESTIMATOR[side]]) for side in SIDES}
    return errors, rel_apart(stats["recal-run"], stats["fvcore"], refs["population"])


def rel_apart(a, b, ref):
    """max |a - b| over every BN buffer pair, relative as the agreed metric: a mean to
    max(|mean|, std), a variance to itself (both of the float64 reference)."""
    worst = 0.0
    for mean_key in (k for k in ref if k.endswith("running_mean")):
        var_key = mean_key[: -len("mean")] + "var"
        rm, rv = ref[mean_key], ref[var_key]
        scale = {mean_key: rm.abs().maximum(rv.clamp(min=0).sqrt()), var_key: rv.abs()}
        for key, s in scale.items():
            d = (a[key].double() - b[key].double()).abs() / s.clamp(min=1e-30)
            worst = max(worst, d.max().item())
    return worst


# ---------------------------------------------------------------------------- report


def print_phases(side, times, outs):
    """A Python side's phases (its JSON line), medians over the timed runs; the rest of
    the wall time is the interpreter's start and exit."""
    notes = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    med = {k: statistics.median(n[k] for n in notes) for k in ("import_s", "load_s", "compute_s", "save_s")}
    rest = statistics.median(t - sum(n[k] for k in med) for t, n in zip(times, notes))
    print("%s side (%s), medians: import %.2fs, load %.2fs, compute %.2fs, save %.2fs, interpreter start+exit "
          "%.2fs" % (side, notes[-1]["library"], med["import_s"], med["load_s"], med["compute_s"], med["save_s"], rest))


def print_family(family, times, cpu, outs, errors, apart):
    for side in ("fvcore", "update_bn"):
        print_phases(side, times[side], outs[side])
    print("| %-10s | %8s | %8s | %10s | %13s | %s |" % ("side", "median s", "min s", "median cpu", "worst err/tol",
                                                       "runs (wall s)"))
    print("|%s|%s|%s|%s|%s|%s|" % ("-" * 12, "-" * 10, "-" * 10, "-" * 12, "-" * 15, "-" * 40))
    for side in SIDES:
        ts = times[side]
        print("| %-10s | %8.2f | %8.2f | %10.2f | %13.3g | %s |"
              % (side, statistics.median(ts), min(ts), statistics.median(cpu[side]), errors[side],
                 " ".join("%.2f" % t for t in ts)))
    print("recal-run / fvcore %.3f, recal-run / update_bn %.3f (wall; CPU seconds: %.3f, %.3f; medians of "
          "per-round ratios); recal-run vs fvcore statistics: max rel diff %.2e"
          % (pair_ratio(times, "recal-run", "fvcore"), pair_ratio(times, "recal-run", "update_bn"),
             pair_ratio(cpu, "recal-run", "fvcore"), pair_ratio(cpu, "recal-run", "update_bn"), apart))


def print_summary(rows, args):
    print()
    print("Summary: %d batches of %dx3x%dx%d, %d threads, %d rounds; wall-clock ratios, then the same of CPU "
          "seconds (recal/fvcore / recal/update_bn); err/tol: worst error against the float64 reference in units "
          "of rtol 1e-5 (<= 1 passes)" % (args.batches, args.batch_size, args.size, args.size,
                                                             args.threads, args.repeats))
    print("| family | recal-run s | fvcore s | update_bn s | recal/fvcore | recal/update_bn | CPU s ratios "
          "| recal/forward | err/tol recal | fvcore | update_bn |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for family, r in rows.items():
        med = {side: statistics.median(r["times"][side]) for side in SIDES}
        fwd = "%.3f" % r["forward"] if r["forward"] is not None else "-"
        print("| %s | %.2f | %.2f | %.2f | **%.3f** | **%.3f** | %.3f / %.3f | %s | %.3g | %.3g | %.3g |"
              % (family, med["recal-run"], med["fvcore"], med["update_bn"],
                 pair_ratio(r["times"], "recal-run", "fvcore"), pair_ratio(r["times"], "recal-run", "update_bn"),
                 pair_ratio(r["cpu"], "recal-run", "fvcore"), pair_ratio(r["cpu"], "recal-run", "update_bn"), fwd, r["errors"]["recal-run"], r["errors"]["fvcore"], r["errors"]["update_bn"]))


# ---------------------------------------------------------------------------- main


def compare_family(args, binary, tmp, family, data):
    t0 = time.time()
    model, archive, weights = make_model(tmp, family)
    print()
    print("== %s: scripted (eval) archive + state_dict, %d batches of %dx3x%dx%d float32 npy, %d threads "
          "(made in %.1fs)" % (family, args.batches, args.batch_size, args.size, args.size, args.threads,
                               time.time() - t0))
    cmds = side_commands(args, binary, family, archive, weights, data, tmp)
    times, cpu, outs = run_interleaved(cmds, args.repeats)
    errors, apart = stats_errors(model, data, args, {side: cmds[side][1] for side in SIDES})
    print_family(family, times, cpu, outs, errors, apart)
    forward = None
    if args.overhead_reps > 0:
        forward = recal_over_forward(args.overhead_bin, archive, args)
        print("recalibration / plain train-mode forward, one process (recalibration_overhead, %d batches, "
              "%d reps): %.3f" % (args.overhead_batches, args.overhead_reps, forward))
    return dict(times=times, cpu=cpu, errors=errors, forward=forward)


def process_starts(binary, repeats):
    starts = {"recal-run": [], "python": []}
    for _ in range(repeats):
        starts["recal-run"].append(timed([binary, "--version"])[0])
        starts["python"].append(timed([PYTHON, "-c", "import torch, torchvision"])[0])
    print("process start, median of %d: recal-run --version %.2f s; python -c 'import torch, torchvision' %.2f s"
          % (repeats, statistics.median(starts["recal-run"]), statistics.median(starts["python"])))


def executable(path, hint):
    path = os.path.abspath(path)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise SystemExit("%s not found (%s)" % (path, hint))
    return path


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(_ROOT, "build", "bin", "recal-run"))
    ap.add_argument("--overhead_bin", default=os.path.join(_ROOT, "build", "bin", "recalibration_overhead"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds after the warm-up")
    ap.add_argument("--overhead_batches", type=int, default=4, help="recalibration_overhead: batches per rep")
    ap.add_argument("--overhead_reps", type=int, default=5, help="recalibration_overhead reps (>= 5; 0: skip)")
    ap.add_argument("--families", default="resnet18,mobilenet_v2,resnet50")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    return ap.parse_args()


def main():
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when piped to a file
    args = parse_args()
    binary = executable(args.bin, "scripts/build.sh builds it")
    if args.overhead_reps > 0:
        args.overhead_bin = executable(args.overhead_bin, "scripts/build.sh builds it; --overhead_reps 0 skips it")
    executable(PYTHON, "scripts/venv.sh makes the venv")
    import torch

    print("torch %s (the venv's; recal-run links its LibTorch), %d threads each side"
          % (torch.__version__, args.threads))
    tmp = tempfile.mkdtemp(prefix="recal-bench-")
    try:
        process_starts(binary, args.repeats)
        data = os.path.join(tmp, "data.npy")
        make_data(data, args.batches, args.batch_size, args.size)
        rows = {family: compare_family(args, binary, tmp, family, data) for family in args.families.split(",")}
        print_summary(rows, args)
    finally:
        if args.keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
