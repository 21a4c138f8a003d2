#!/usr/bin/env python3
"""End-to-end check of the `recal-run` binary against the fixtures' float64 references.

    .venv/bin/python tests/e2e/check_recal_run.py --bin build/bin/recal-run --fixtures DIR
        [--families a,b] [--jobs N] [--keep] [--lenient-stderr]

For every manifest line (all families, every TorchScript and torch.export variant; --threads
1) it runs recal-run into a temp dir and checks, with the venv's torch:
  - OUT loads with torch.jit.load (TorchScript) or torch.export.load (PT2, the format it came
    in); no "recal::" in its code, graphs or archive entries; training flag (TorchScript),
    parameters and other buffers as in the input archive;
  - its running_mean/var equal the reference (the agreed metric, rtol from the reference's
    metadata, 1e-5 by default):
        |new_mean - ref_mean| <= rtol * max(|ref_mean|, sqrt(ref_var)) + 1e-12
        |new_var  - ref_var|  <= rtol * ref_var + 1e-12
    unused layers keep their old statistics (the reference holds them);
  - the BN safetensors holds exactly the running_mean/var keys, equal to OUT.pt's values,
    and the eager model (models.build) takes it with load_state_dict(strict=False) with no
    unexpected keys;
  - the report (protobuf JSON, snake_case names) has "layers" with name, channels, samples,
    calls, used for every layer, matching the reference; "unused_layers" lists exactly the
    manifest's unused layers; calls_per_forward matches the manifest's exceptions (else 1).
Also: both estimators for resnet18 and twice; --iterations 2 on the quantization-aware qat_fx;
--modules train/as_saved, --threads 2,
--include/--exclude and --max_batches on small families; and failure paths, which must
exit non-zero with a one-line stderr reason and leave no output file: corrupt archive,
truncated archive, wrong channel count, NaN data (message names the layer), missing model
and data paths, --max_batches past the data (and success with --allow_short_data).

Prints `N passed, M failed` and exits 1 if anything failed.
"""

import argparse
import concurrent.futures
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "tests", "fixtures"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import check_exported_result  # noqa: E402

import models  # noqa: E402
import reference  # noqa: E402
import safetensors_io  # noqa: E402


# ------------------------------------------------------------------------------ manifest


class Line:
    def __init__(self, fixtures, cols):
        (self.family, self.variant, model, self.data, bs, pop, avg, unused, calls) = cols[:9]
        self.model = os.path.join(fixtures, model)
        self.batch_size = int(bs)
        self.refs = {"population": os.path.join(fixtures, pop), "batch_average": os.path.join(fixtures, avg)}
        self.unused = set() if unused == "-" else set(unused.split(","))
        self.calls = {}
        if calls != "-":
            for item in calls.split(","):
                k, v = item.rsplit("=", 1)
                self.calls[k] = float(v)


def read_manifest(fixtures):
    path = os.path.join(fixtures, "manifest.tsv")
    lines = []
    with open(path) as f:
        for i, raw in enumerate(f):
            raw = raw.rstrip("\n")
            if not raw or raw.startswith("#"):
                continue
            cols = raw.split("\t")
            if len(cols) < 9:
                raise SystemExit("%s:%d: %d columns, want 9" % (path, i + 1, len(cols)))
            lines.append(Line(fixtures, cols))
    return lines


_REF_CACHE = {}


def load_ref(path):
    if path not in _REF_CACHE:
        tensors, meta = safetensors_io.load(path, with_metadata=True)
        layers = json.loads(meta.get("layers", "{}"))
        rtol = float(meta.get("rtol", "1e-5"))
        _REF_CACHE[path] = (tensors, layers, rtol)
    return _REF_CACHE[path]


_ARCHIVE_CACHE = {}


def is_exported(path):
    """A torch.export program (PT2 archive), as the fixtures name them."""
    return path.endswith(".pt2")


def load_archive(path):
    """(state_dict, training or None, the loaded object) of a TorchScript archive, or of a
    PT2 archive through torch.export.load (an exported program has no training flag)."""
    if is_exported(path):
        program = torch.export.load(path)
        return {k: v.detach().clone() for k, v in program.state_dict.items()}, None, program
    m = torch.jit.load(path)
    return {k: v.clone() for k, v in m.state_dict().items()}, m.training, m


def archive_state(path):
    """(state_dict, training) of an input archive."""
    if path not in _ARCHIVE_CACHE:
        state, training, _ = load_archive(path)
        _ARCHIVE_CACHE[path] = (state, training)
    return _ARCHIVE_CACHE[path]


# ------------------------------------------------------------------------------ cases


class Case:
    """One recal-run invocation and what must come of it."""

    def __init__(self, name, args, expect_ok, work, line=None, estimator="population", **kw):
        self.name = name
        self.args = args
        self.expect_ok = expect_ok
        self.work = work
        self.line = line
        self.estimator = estimator
        self.kw = kw  # ref (override), old_keys (must keep old stats), stderr_has
        model = args[args.index("--model") + 1] if "--model" in args else ""
        self.out = os.path.join(work, "out.pt2" if is_exported(model) else "out.pt")
        self.bn = os.path.join(work, "bn.safetensors")
        self.report = os.path.join(work, "report.json")
        self.rc = None
        self.stdout = self.stderr = ""
        self.seconds = 0.0

    def command(self, binary):
        return [binary] + self.args + ["--out", self.out, "--bn_out", self.bn, "--report", self.report]


def run_case(case, binary, timeout):
    os.makedirs(case.work, exist_ok=True)
    t0 = time.time()
    try:
        p = subprocess.run(case.command(binary), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        case.rc = p.returncode
        case.stdout = p.stdout.decode("utf-8", "replace")
        case.stderr = p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        case.rc = "timeout"
        case.stderr = "timed out after %ss" % timeout
    except OSError as e:
        case.rc = "exec"
        case.stderr = str(e)
    case.seconds = time.time() - t0
    return case


# ------------------------------------------------------------------------------ checks


def check_no_recal_ops(path, module, errors):
    """No Recal operator in the archive's entries, nor (TorchScript) in its graphs or code."""
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            if "data" in parts[1:2]:  # tensor storages
                continue
            if b"recal::" in z.read(info) or b"torch.ops.recal." in z.read(info):
                errors.append("archive entry %s mentions recal::" % info.filename)
    if module is None:
        return
    try:
        if "recal::" in str(module.inlined_graph):
            errors.append("inlined forward graph calls a recal:: op")
    except Exception as e:  # noqa: BLE001
        errors.append("cannot inline forward graph: %s" % e)
    for name, sub in module.named_modules():
        try:
            code = sub.code
        except Exception:  # noqa: BLE001  (modules without a forward)
            continue
        if "recal::" in code:
            errors.append("code of %r mentions recal::" % (name or "<root>"))


def check_stats(got, ref, layers, rtol, errors, what):
    worst, problems = reference.layer_errors(got, ref, layers, rtol)
    errors += ["%s: %s" % (what, p) for p in problems]
    return worst


def _int(v):
    return int(v) if isinstance(v, (int, str)) and str(v).lstrip("-").isdigit() else None


def check_report(path, line, layers, errors):
    try:
        with open(path) as f:
            rep = json.load(f)
    except Exception as e:  # noqa: BLE001
        errors.append("report: does not parse as JSON: %s" % e)
        return
    rl = rep.get("layers")
    if not isinstance(rl, list):
        errors.append("report: no \"layers\" list")
        return
    # Quantization-aware families: every quantizer counted, all held still.
    quantizers = rep.get("quantizers") or {}
    if line.family in models.QAT_FAMILIES and _int(quantizers.get("count", 0)) < 1:
        errors.append("report: quantizers %r, want a count" % (quantizers,))
    if line.family not in models.QAT_FAMILIES and quantizers:
        errors.append("report: quantizers %r in a model without" % (quantizers,))
    for i, layer in enumerate(rl):
        missing = [k for k in ("name", "channels", "samples", "calls", "used") if k not in layer]
        if missing:
            errors.append("report: layer %d (%s) lacks %s (protobuf JSON omits defaults unless "
                          "always_print_primitive_fields is set)" % (i, layer.get("name", "?"), ",".join(missing)))
    if len(rl) != len(layers):
        errors.append("report: %d layers, reference has %d" % (len(rl), len(layers)))
    for name, info in sorted(layers.items()):
        cands = {name, info["mean_key"]}
        # module path of the buffers' owner ("" for the root module)
        cands.add(info["mean_key"].rsplit(".", 1)[0] if "." in info["mean_key"] else "")
        match = [layer for layer in rl
                 if layer.get("name") in cands or info["mean_key"] in [v for v in layer.values() if isinstance(v, str)]]
        if len(match) != 1:
            errors.append("report: %d layers match %r" % (len(match), name))
            continue
        layer = match[0]
        if _int(layer.get("channels")) != info["channels"]:
            errors.append("report: %s channels %r, want %d" % (name, layer.get("channels"), info["channels"]))
        used = bool(layer.get("used", False))
        if used != info["used"]:
            errors.append("report: %s used=%r, want %r" % (name, layer.get("used"), info["used"]))
        if _int(layer.get("samples", 0)) != info["samples"]:
            errors.append("report: %s samples %r, want %d" % (name, layer.get("samples"), info["samples"]))
        if _int(layer.get("calls", 0)) != info["calls"]:
            errors.append("report: %s calls %r, want %d" % (name, layer.get("calls"), info["calls"]))
        if _int(layer.get("calls_without_variance", 0)) != info["calls_without_variance"]:
            errors.append("report: %s calls_without_variance %r, want %d" % (
                name, layer.get("calls_without_variance"), info["calls_without_variance"]))
        want_cpf = line.calls.get(name, 1) if info["used"] else 0
        if "calls_per_forward" in layer or name in line.calls:
            cpf = _int(layer.get("calls_per_forward", 0))
            if cpf is None:
                try:
                    cpf = float(layer.get("calls_per_forward"))
                except (TypeError, ValueError):
                    cpf = None
            if cpf != want_cpf:
                errors.append("report: %s calls_per_forward %r, want %g" % (name, layer.get("calls_per_forward"), want_cpf))
    unused = rep.get("unused_layers", [])
    if not isinstance(unused, list):
        errors.append("report: unused_layers is not a list")
    elif set(unused) != line.unused:
        errors.append("report: unused_layers %s, want %s" % (sorted(unused), sorted(line.unused)))


def check_success(case):
    errors = []
    line = case.line
    ref, layers, rtol = case.kw.get("ref") or load_ref(line.refs[case.estimator])
    if case.kw.get("old_keys"):
        # Layers that must keep their old statistics (e.g. excluded): the reference is the
        # archive's own buffers for them.
        ref = dict(ref)
        old_state, _ = archive_state(line.model)
        for k in case.kw["old_keys"]:
            ref[k] = old_state[k].double()
    for p in (case.out, case.bn, case.report):
        if not os.path.isfile(p):
            errors.append("no output file %s" % os.path.basename(p))
    if errors:
        return errors
    try:
        got, out_training, out = load_archive(case.out)
    except Exception as e:  # noqa: BLE001
        return ["OUT does not load: %s" % str(e).splitlines()[0]]
    check_no_recal_ops(case.out, None if is_exported(case.out) else out, errors)
    case.worst = check_stats(got, ref, layers, rtol, errors, "OUT.pt")
    # Everything else is untouched.
    old_state, old_training = archive_state(line.model)
    bn_keys = set(models_bn_keys(layers))
    if set(got) != set(old_state):
        errors.append("OUT.pt state_dict keys differ from the input: %s" % sorted(set(got) ^ set(old_state))[:6])
    for k, v in old_state.items():
        if k in bn_keys or k.endswith("num_batches_tracked") or k not in got:
            continue
        if not torch.equal(got[k], v):
            errors.append("OUT.pt changed %s" % k)
    if out_training != old_training:
        errors.append("OUT.pt training=%s, the input archive has %s" % (out_training, old_training))
    # BN safetensors.
    try:
        bn = safetensors_io.load(case.bn)
    except Exception as e:  # noqa: BLE001
        errors.append("bn safetensors does not parse: %s" % e)
        bn = None
    if bn is not None:
        if set(bn) != bn_keys:
            errors.append("bn safetensors keys: extra %s, missing %s"
                          % (sorted(set(bn) - bn_keys)[:6], sorted(bn_keys - set(bn))[:6]))
        for k in sorted(bn_keys & set(bn)):
            a, b = bn[k], got.get(k)
            if b is None or a.shape != b.shape:
                errors.append("bn safetensors %s shape %s, OUT.pt %s" % (k, tuple(a.shape), None if b is None else tuple(b.shape)))
            elif not torch.equal(a.to(b.dtype), b) and not torch.allclose(a.double(), b.double(), rtol=2e-7, atol=0):
                errors.append("bn safetensors %s differs from OUT.pt" % k)
        eager, _ = models.build(line.family)
        try:
            res = eager.load_state_dict(bn, strict=False)
            if res.unexpected_keys:
                errors.append("eager load_state_dict: unexpected keys %s" % res.unexpected_keys[:6])
        except Exception as e:  # noqa: BLE001
            errors.append("eager load_state_dict failed: %s" % str(e).splitlines()[0])
    if case.kw.get("outputs"):
        # The program torch.export.load opens computes, in eval mode, what the eager model with
        # the reference's statistics computes (check_exported_result.py).
        errors += ["outputs: " + p for p in check_exported_result.check_exported_result(
            case.out, line.family, line.refs["population"], variant=line.variant)]
    if case.kw.get("report") == "parse":
        # (--include/--exclude: how excluded layers are reported is not pinned down here)
        try:
            with open(case.report) as f:
                if not isinstance(json.load(f).get("layers"), list):
                    errors.append("report: no \"layers\" list")
        except Exception as e:  # noqa: BLE001
            errors.append("report: does not parse as JSON: %s" % e)
    else:
        check_report(case.report, line, layers, errors)
    return errors


def models_bn_keys(layers):
    keys = []
    for info in layers.values():
        keys += [info["mean_key"], info["var_key"]]
    return keys


def check_failure(case, lenient):
    errors = []
    if case.rc == 0:
        return ["exited 0, expected a failure"]
    if case.rc in ("timeout", "exec"):
        return ["%s: %s" % (case.rc, case.stderr)]
    if isinstance(case.rc, int) and case.rc < 0:
        errors.append("killed by signal %d (a crash, not a clean failure)" % -case.rc)
    lines = [l for l in case.stderr.splitlines() if l.strip()]
    # Progress lines may come first; the reason is the last line, one line, prefixed.
    if not lines:
        errors.append("no reason on stderr")
    elif not lines[-1].startswith("recal-run: ") and not lenient:
        errors.append("the last stderr line is not recal-run's reason: %r" % lines[-1])
    for marker in ("Exception raised from", "frame #", "Traceback"):
        if marker in case.stderr:
            errors.append("stderr has a backtrace (%r)" % marker)
    want = case.kw.get("stderr_has")
    if want and lines and not any(w in lines[-1] for w in want):
        errors.append("reason does not mention %s" % " or ".join(repr(w) for w in want))
    for p in (case.out, case.bn, case.report):
        if os.path.exists(p):
            errors.append("left %s behind after failing" % os.path.basename(p))
    return errors


# ------------------------------------------------------------------------------ plan


def plan(args, lines, work):
    cases = []
    n = [0]

    def wdir(tag):
        n[0] += 1
        return os.path.join(work, "%03d-%s" % (n[0], tag))

    def base(line, extra=(), threads=1):
        return ["--model", line.model, "--data", line.data, "--batch_size", str(line.batch_size),
                "--threads", str(threads)] + list(extra)

    by = {(l.family, l.variant): l for l in lines}
    for line in lines:
        tag = "%s.%s" % (line.family, line.variant)
        # Every result of an exported program: its eval-mode outputs too.
        cases.append(Case(tag, base(line), True, wdir(tag), line, outputs=is_exported(line.model)))
    for fam in ("resnet18", "twice"):
        for variant in sorted(v for f, v in by if f == fam and not v.startswith("torch113")):
            line = by[(fam, variant)]
            tag = "%s.%s.batch_average" % (fam, variant)
            cases.append(Case(tag, base(line, ["--estimator", "batch_average"]), True, wdir(tag), line,
                              estimator="batch_average"))
        line = by.get((fam, "scripted_eval"))
        if line:
            tag = "%s.scripted_eval.population" % fam
            cases.append(Case(tag, base(line, ["--estimator", "population"]), True, wdir(tag), line))

    # resnet18 has no module whose mode matters besides BN: every --modules gives the reference.
    for variant in ("scripted_train", "exported_train"):
        line = by.get(("resnet18", variant))
        for mode in ("eval", "train", "as_saved") if line else ():
            tag = "resnet18.%s.modules_%s" % (variant, mode)
            cases.append(Case(tag, base(line, ["--modules", mode]), True, wdir(tag), line))
    line = by.get(("resnet18", "scripted_train"))
    if line:
        tag = "resnet18.scripted_train.threads2"
        cases.append(Case(tag, base(line, threads=2), True, wdir(tag), line))

    # Quantization-aware models: two passes (--iterations 2), the second on the statistics of
    # the first, against the reference of two passes (reference.reference_passes).
    for variant in ("exported_train", "traced_eval"):
        line = by.get(("qat_fx", variant))
        if line:
            two = line.refs["population"].replace(".population.", ".population.iterations2.")
            tensors, _, rtol = load_ref(two)
            _, layers, _ = load_ref(line.refs["population"])
            tag = "qat_fx.%s.iterations_2" % variant
            cases.append(Case(tag, base(line, ["--iterations", "2"]), True, wdir(tag), line,
                              ref=(tensors, layers, rtol), report="parse"))

    # two_input: independent branches, so excluding one leaves the other exact.
    line = by.get(("two_input", "scripted_eval"))
    if line:
        cases.append(Case("two_input.exclude_bn_b", base(line, ["--exclude", "bn_b"]), True, wdir("exclude"), line,
                          old_keys=["bn_b.running_mean", "bn_b.running_var"], report="parse"))
        cases.append(Case("two_input.include_bn_a", base(line, ["--include", "bn_a"]), True, wdir("include"), line,
                          old_keys=["bn_b.running_mean", "bn_b.running_var"], report="parse"))

    # --max_batches 2 on twice: reference on the first two batches, computed here.
    line = by.get(("twice", "traced_eval"))
    if line and line.data.startswith("npy:"):
        x = torch.from_numpy(np.load(line.data[4:]))
        eager, _ = models.build("twice")
        batches = models.make_batches([x], line.batch_size, max_batches=2)
        refs, info = reference.reference_all(copy.deepcopy(eager), batches, "twice")
        cases.append(Case("twice.traced_eval.max_batches_2", base(line, ["--max_batches", "2"]), True,
                          wdir("max2"), line, ref=(refs["population"], info, models.rtol("twice"))))

    if args.no_failure_paths:
        return cases

    # ---- failure paths, on the small `dropout` family (first BN: bn1).
    line = by.get(("dropout", "scripted_eval"))
    if line is None or not line.data.startswith("npy:"):
        return cases
    fdir = os.path.join(work, "inputs")
    os.makedirs(fdir, exist_ok=True)
    corrupt = os.path.join(fdir, "corrupt.pt")
    with open(corrupt, "wb") as f:
        f.write(random.Random(0).randbytes(64 * 1024))
    truncated = os.path.join(fdir, "truncated.pt")
    with open(line.model, "rb") as f:
        blob = f.read()
    with open(truncated, "wb") as f:
        f.write(blob[: len(blob) // 2])
    x = np.load(line.data[4:])
    wrong = os.path.join(fdir, "wrong_channels.npy")
    np.save(wrong, np.ascontiguousarray(np.concatenate([x, x[:, :2]], axis=1)))
    nan = os.path.join(fdir, "nan.npy")
    xn = x.copy()
    xn[line.batch_size + 2, 1, 5, 5] = np.nan  # second batch
    np.save(nan, xn)
    missing = os.path.join(fdir, "does_not_exist")

    def fail(tag, argv, **kw):
        cases.append(Case("fail." + tag, argv, False, wdir("fail-" + tag), line, **kw))

    def with_(model=None, data=None, extra=()):
        return ["--model", model or line.model, "--data", data or line.data,
                "--batch_size", str(line.batch_size), "--threads", "1"] + list(extra)

    fail("corrupt_archive", with_(model=corrupt))
    fail("truncated_archive", with_(model=truncated))
    fail("wrong_channels", with_(data="npy:" + wrong))
    # The first BatchNorm whose input holds the NaN, the sample within the batch, the batch.
    fail("nan_data", with_(data="npy:" + nan), stderr_has=["layer 'bn1' holds NaN at [2, ", "in batch 1"])
    fail("missing_model", with_(model=missing + ".pt"))
    fail("missing_data", with_(data="npy:" + missing + ".npy"))
    fail("max_batches_past_data", with_(extra=["--max_batches", "100"]))
    # The same through an exported program: a truncated PT2 archive, NaN data.
    exported = by.get(("dropout", "exported_eval"))
    if exported:
        truncated_pt2 = os.path.join(fdir, "truncated.pt2")
        with open(exported.model, "rb") as f:
            blob = f.read()
        with open(truncated_pt2, "wb") as f:
            f.write(blob[: len(blob) // 2])
        fail("truncated_pt2", with_(model=truncated_pt2), stderr_has=["damaged or truncated zip"])
        fail("nan_data_exported", with_(model=exported.model, data="npy:" + nan),
             stderr_has=["layer 'bn1' holds NaN at [2, ", "in batch 1"])
    cases.append(Case("dropout.scripted_eval.allow_short_data", with_(extra=["--max_batches", "100", "--allow_short_data"]),
                      True, wdir("allow-short"), line))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="path to recal-run")
    ap.add_argument("--fixtures", required=True, help="directory made by tests/fixtures/make_fixtures.py")
    ap.add_argument("--families", default="", help="comma-separated subset (default: all)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="recal-run processes at once")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per recal-run")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--lenient-stderr", action="store_true", help="do not check the form of the reason line")
    ap.add_argument("--no-failure-paths", action="store_true")
    args = ap.parse_args()

    binary = os.path.abspath(args.bin)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        print("check_recal_run: %s is not an executable file" % binary, file=sys.stderr)
        return 2
    fixtures = os.path.abspath(args.fixtures)
    lines = read_manifest(fixtures)
    if args.families:
        want = set(args.families.split(","))
        unknown = want - {l.family for l in lines}
        if unknown:
            print("check_recal_run: unknown families %s" % sorted(unknown), file=sys.stderr)
            return 2
        lines = [l for l in lines if l.family in want]
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="recal-e2e-")
    passed = failed = 0
    t0 = time.time()
    # --help documents every flag, those declared beside the object-storage client too, and exits 0.
    helped = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    missing = [f for f in ("--model", "--data", "--out", "--decode_threads", "--prefetch", "--device",
                           "--s3_endpoint") if "\n  %s=" % f not in helped.stdout]
    if helped.returncode != 0:
        missing.append("(exit status %d, not 0)" % helped.returncode)
    print("%s recal-run --help lists every flag%s" % ("FAIL" if missing else "PASS",
                                                       ": missing " + " ".join(missing) if missing else ""))
    failed += bool(missing)
    passed += not missing
    try:
        cases = plan(args, lines, work)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(run_case, c, binary, args.timeout) for c in cases]
            for fut in futures:
                case = fut.result()
                if case.expect_ok:
                    if case.rc != 0:
                        last = [l for l in case.stderr.splitlines() if l.strip()][-3:]
                        errors = ["exit %s: %s" % (case.rc, " | ".join(last) or "(no stderr)")]
                    else:
                        try:
                            errors = check_success(case)
                        except Exception as e:  # noqa: BLE001
                            errors = ["checker error: %r" % e]
                else:
                    errors = check_failure(case, args.lenient_stderr)
                status = "PASS" if not errors else "FAIL"
                if case.expect_ok:
                    detail = "  worst error %.3f of tolerance" % case.worst if hasattr(case, "worst") else ""
                    detail += ", eval outputs as the reference's" if case.kw.get("outputs") else ""
                else:
                    detail = "" if errors else "  (" + case.stderr.strip()[-100:] + ")"
                print("%s %-48s %6.1fs%s" % (status, case.name, case.seconds, detail), flush=True)
                for e in errors[:12]:
                    print("       - " + e)
                if len(errors) > 12:
                    print("       - ... %d more" % (len(errors) - 12))
                if errors:
                    failed += 1
                else:
                    passed += 1
                    if not args.keep:
                        shutil.rmtree(case.work, ignore_errors=True)
    finally:
        if args.keep or failed:
            print("work directory kept: %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed (%.0fs)" % (passed, failed, time.time() - t0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
