"""recal.torch: precise BatchNorm statistics for a PyTorch model, from training code.

    import recal.torch

    result = recal.torch.recalibrate(model, loader, server="recal:50051", token=TOKEN)
    print(result.report.samples, "samples,", result.export)

recalibrate() exports the model with torch.export (the batch dimension dynamic; a PT2
archive), falling back to TorchScript (torch.jit.script, then torch.jit.trace on the first
batch) only when export fails, uploads it (nothing is sent when the server has these bytes), runs a
client_stream job on recal-server fed with the loader's batches (pushed as the job takes
them: back-pressure), downloads the new BatchNorm running statistics and copies them into
`model` in place (its train/eval mode, device, parameters and other buffers unchanged).
Drop-ins for the usual precise-BN call sites: PreciseBN (the detectron2 / fast-reid hook)
and do_precise_bn (PaddleVideo's loop).

Distributed training: when torch.distributed is initialised (world size > 1) every rank
calls recalibrate() with its own part of the data. Rank 0 submits one job sharded by rank
(JobSpec.shards = world size), every rank streams its own batches into its shard (no batch
crosses between ranks), the server merges the shards' statistics exactly, and rank 0
broadcasts the result over gloo so that every rank loads the same statistics: the result
equals one process recalibrating over the union.

Only this module imports torch; `import recal` does not.
"""

import contextlib
import copy
import dataclasses
import inspect
import io
import itertools
import keyword
import linecache
import logging
import os
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Mapping

import grpc

try:
    import torch
except ModuleNotFoundError as _missing:  # another module missing inside torch is torch's own error
    if _missing.name != "torch":
        raise
    raise ModuleNotFoundError("recal.torch needs PyTorch, which this Python does not have: pip install "
                              "'recal[torch]' (or torch itself, as pytorch.org says for your platform)",
                              name="torch") from _missing

from recal import specs
from recal.client import Client
from recal.errors import RecalError
from recal._proto.recal.v1 import recal_pb2
from recal.messages import parse_report
from recal.safetensors_reader import read_safetensors

__all__ = ["recalibrate", "Result", "Pass", "ShortDataWarning", "PreciseBN", "do_precise_bn"]

_log = logging.getLogger(__name__)
_BatchNorm = torch.nn.modules.batchnorm._BatchNorm
_ADAPTER_PREFIX = "model."  # the user's model inside the keyword adapter


class ShortDataWarning(UserWarning):
    """The data ended before num_batches batches."""


@dataclasses.dataclass
class Result:
    """What recalibrate() did.

    report: the job's RunReport (recal.report_pb2): per layer samples, calls, mean shift,
        variance ratio, relative standard error, ...; report.batches / report.samples are
        what the job used.
    job: the final Job message. model_id: the uploaded model ("sha256:<hex>").
    export: "export" (torch.export, a PT2 archive), "script" (torch.export failed),
        "trace" (scripting failed too) or "given" (the model was a ScriptModule or an
        ExportedProgram already). export_error: why each method tried before it failed, one
        "method: error" line each ("" when the first worked).
    batches: batches pushed (every rank's, when distributed); num_batches: asked for;
        short_data: fewer than num_batches (a ShortDataWarning said so too).
    buffers: the state_dict keys loaded into the model. ranks: processes whose batches went
        into the job.
    iterations: with iterations=K > 1, one Pass per job, in order: how far it moved the
        statistics from those it started with (report and job above are the last pass's).
    """

    report: object
    job: object
    model_id: str
    export: str
    export_error: str
    batches: int
    num_batches: int
    short_data: bool
    buffers: tuple
    ranks: int
    iterations: tuple = ()


@dataclasses.dataclass
class Pass:
    """One pass of recalibrate(iterations=K): its job's RunReport, and the worst channel's
    |new mean - old mean| / new std and |new var / old var - 1| over its layers (old: what
    the pass started with, the previous pass's statistics)."""

    report: object
    max_mean_shift_in_std: float
    max_var_change: float


# ----------------------------------------------------------------------------- the model


def _unwrap(model):
    """The module inside DistributedDataParallel / DataParallel."""
    parallel = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    while isinstance(model, parallel):
        model = model.module
    return model


def _bn_keys(model):
    """state_dict keys of the running statistics of every BatchNorm module (eager models)."""
    keys = set()
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm) and module.running_mean is not None:
            prefix = name + "." if name else ""
            keys.update((prefix + "running_mean", prefix + "running_var"))
    return keys


def _has_training_bn(model):
    return any(isinstance(m, _BatchNorm) and m.training for m in _unwrap(model).modules())


class _ExportBatchNorm(_BatchNorm):
    """A SyncBatchNorm's twin for the exported copy (SyncBatchNorm needs a process group
    and CUDA in train mode, and does not script): the same parameters, buffers and
    normalisation, any input rank >= 2."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected an input with at least 2 dimensions")


def _replace_sync_bn(module):
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.SyncBatchNorm):
            twin = _ExportBatchNorm(child.num_features, child.eps, child.momentum, child.affine,
                                    child.track_running_stats)
            twin.load_state_dict(child.state_dict())
            twin.train(child.training)
            setattr(module, name, twin)
        else:
            _replace_sync_bn(child)


_ADAPTER_SOURCE = '''import torch


class KeywordAdapter(torch.nn.Module):
    """recal.torch: the model's keyword inputs as positional ones, in a fixed order."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, {params}):
        return self.model({call})
'''


def _scriptable_adapter(model, keys):
    """A KeywordAdapter for `keys` whose forward TorchScript can compile (generated source,
    registered with linecache so that torch.jit.script can read it), or None when a key is
    not a Python identifier."""
    if not all(k.isidentifier() and not keyword.iskeyword(k) for k in keys):
        return None
    if keys not in _ADAPTERS:  # one class per key order, made once
        params = ", ".join("x%d: torch.Tensor" % i for i in range(len(keys)))
        call = ", ".join("%s=x%d" % (k, i) for i, k in enumerate(keys))
        source = _ADAPTER_SOURCE.format(params=params, call=call)
        tag = uuid.uuid4().hex
        filename = "<recal.torch keyword adapter %s>" % tag
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace = {"__name__": "recal_torch_adapter_" + tag}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 (our own template)
        _ADAPTERS[keys] = namespace["KeywordAdapter"]
    return _ADAPTERS[keys](model)


_ADAPTERS = {}


class _TracedKeywordAdapter(torch.nn.Module):
    """The same for torch.export and torch.jit.trace (any key)."""

    def __init__(self, model, keys):
        super().__init__()
        self.model = model
        self.keys = tuple(keys)

    def forward(self, *inputs):
        return self.model(**dict(zip(self.keys, inputs)))


@dataclasses.dataclass
class _Archive:
    """What _export wrote: `path` (a PT2 archive for "export" and a given ExportedProgram, a
    TorchScript one otherwise), made by `how`; `prefix` of the model's names in it; `error`:
    why each method tried before `how` failed."""

    path: str
    how: str
    prefix: str
    error: str


_METHODS = {"auto": ("export", "script", "trace"), "export": ("export",), "script": ("script",),
            "trace": ("trace",)}
# torch.jit's functions warn that they are deprecated (FutureWarning since PyTorch 2.11):
# Recal's own fallback calls are no news to the user, so they do not warn.
_JIT_DEPRECATED = r"`torch\.jit\.\w+` is deprecated"


@contextlib.contextmanager
def _quiet_jit():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_JIT_DEPRECATED, category=FutureWarning)
        warnings.filterwarnings("ignore", message=_JIT_DEPRECATED, category=DeprecationWarning)
        yield


def _save_cpu(script_module, path):
    with _quiet_jit():
        torch.jit.save(script_module, path)
        if any(t.device.type != "cpu" for t in itertools.chain(script_module.parameters(),
                                                                script_module.buffers())):
            torch.jit.save(torch.jit.load(path, map_location="cpu"), path)


def _save_program(program, path):
    """torch.export.save of a copy of `program` without its example inputs (the archive would
    otherwise carry the first batch: bytes the server never reads, and a new model id for
    every batch), its tensors on the CPU."""
    if any(t.device.type != "cpu" for t in itertools.chain(program.state_dict.values(),
                                                            program.constants.values())
           if isinstance(t, torch.Tensor)):
        from torch.export.passes import move_to_device_pass
        program = move_to_device_pass(program, "cpu")
    program = copy.copy(program)
    program.example_inputs = None
    torch.export.save(program, path)


def _error_text(error):
    return ("%s: %s" % (type(error).__name__, error)).strip()[:2000]


@contextlib.contextmanager
def _export_output():
    """A failed torch.export prints the partial graph to stderr (twice) and logs guard
    details there: the fallback is an ordinary path here, and the error is kept in
    export_error, so that output goes to this module's debug log instead. After a
    successful export whatever was written meanwhile goes on to stderr as it was."""
    captured = io.StringIO()
    failed = True
    try:
        with contextlib.redirect_stderr(captured):
            yield
        failed = False
    finally:
        text = captured.getvalue()
        if text and failed:
            _log.debug("recal.torch: torch.export's output:\n%s", text)
        elif text:
            sys.stderr.write(text)


def _batch_example(example):
    """The example inputs for torch.export: a first batch of one sample given twice, since
    export specialises a dimension of size 1 (the program takes any batch size)."""
    if example[0].shape[0] == 1:
        return tuple(torch.cat([x, x]) for x in example)
    return tuple(example)


def _export_program(target, example, path):
    """torch.export.export of `target` in its own train/eval modes (the graph keeps each
    BatchNorm's and dropout's mode, as a script keeps `training`), dimension 0 of every
    input dynamic (one size: the batch), saved with torch.export.save. Export runs the
    forward on fake tensors: it changes no buffer; its random numbers are not the caller's."""
    args = _batch_example(example)
    batch = torch.export.Dim("batch", min=1)
    shapes = torch.export.ShapesCollection()
    for x in args:
        shapes[x] = {0: batch}
    with torch.random.fork_rng(devices=[]), _export_output():
        program = torch.export.export(target, args, dynamic_shapes=shapes.dynamic_shapes(target, args))
    _save_program(program, path)


def _script(model, keys, path):
    """torch.jit.script of `model`, or of a KeywordAdapter around it for keyword inputs."""
    target = _scriptable_adapter(model, keys) if keys else model
    if target is None:
        raise TypeError("keys %s are not all Python identifiers" % (list(keys),))
    with _quiet_jit():
        torch.jit.save(torch.jit.script(target), path)


def _trace(target, example, path):
    """torch.jit.trace on the first batch. The trace runs the forward once: on the copy,
    with its BatchNorm buffers put back afterwards (the archive's old statistics are what
    excluded layers keep), and without consuming the caller's random numbers (dropout)."""
    saved = {name: buffer.clone() for name, buffer in target.named_buffers()}
    with torch.no_grad(), torch.random.fork_rng(devices=[]), _quiet_jit():
        # F.batch_norm's own batch-size check warns on every trace in train mode.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module="torch.nn.functional")
        traced = torch.jit.trace(target, tuple(example), check_trace=False, strict=False)
    with torch.no_grad():
        for name, buffer in traced.named_buffers():
            if name in saved:
                buffer.copy_(saved[name])
    with _quiet_jit():
        torch.jit.save(traced, path)


def _given(model, keys, directory):
    """A ScriptModule or ExportedProgram as it is (its tensors on the CPU), or None."""
    if isinstance(model, torch.export.ExportedProgram):
        path, save = os.path.join(directory, "model.pt2"), _save_program
    elif isinstance(model, torch.jit.ScriptModule):
        path, save = os.path.join(directory, "model.pt"), _save_cpu
    else:
        return None
    if keys:
        raise TypeError("a %s takes positional inputs here; give an input_fn that returns a tuple "
                        "(a dict batch needs an eager model)" % type(model).__name__)
    save(model, path)
    return _Archive(path, "given", "", "")


def _export(model, example, keys, directory, how):
    """Writes `model` into `directory` as an archive for the server: with torch.export (a
    PT2 archive), or, when that fails under how="auto", torch.jit.script and then
    torch.jit.trace on the first batch (TorchScript, deprecated since PyTorch 2.11). A
    method asked for alone raises its failure. Returns an _Archive."""
    given = _given(model, keys, directory)
    if given is not None:
        return given
    if how not in _METHODS:
        raise ValueError("export must be 'auto', 'export', 'script' or 'trace', not %r" % (how,))
    cpu = copy.deepcopy(model).cpu()  # the caller's model is never touched
    _replace_sync_bn(cpu)
    prefix = _ADAPTER_PREFIX if keys else ""
    positional = _TracedKeywordAdapter(cpu, keys) if keys else cpu
    attempts = {
        "export": lambda path: _export_program(positional, example, path),
        "script": lambda path: _script(cpu, keys, path),
        "trace": lambda path: _trace(positional, example, path),
    }
    errors = []
    methods = _METHODS[how]
    for method, then in zip(methods, methods[1:] + (None,)):
        path = os.path.join(directory, "model.pt2" if method == "export" else "model.pt")
        try:
            attempts[method](path)
            return _Archive(path, method, prefix, "\n".join(errors))
        except Exception as error:  # noqa: BLE001 (any failure: the next method, if any)
            if then is None:
                _raise_export_failure(method, error, errors)
            errors.append("%s: %s" % (method, _error_text(error)))
            _log.info("recal.torch: %s failed, trying %s: %s", method, then, _error_text(error))


def _raise_export_failure(method, error, errors):
    """The last method failed: export="export" says so plainly (torch.export's error
    follows); the others raise their own error, as before."""
    if method == "export":
        raise RuntimeError("recal.torch: torch.export could not capture the model (export='export'): %s; "
                           "make the forward exportable (see the error), or give export='auto' to fall "
                           "back to TorchScript" % _error_text(error)) from error
    if errors:
        _log.info("recal.torch: %s", "; ".join(errors))
    raise error


# ------------------------------------------------------------------------------ batches

_WIRE = (torch.float32, torch.float16, torch.uint8)


def _default_input_fn(batch):
    """A tensor as is; a tuple/list: its first element (as fvcore does); a dict: its
    tensors, as keyword arguments of the forward (those the forward takes)."""
    if isinstance(batch, (torch.Tensor, Mapping)):
        return batch
    if isinstance(batch, (list, tuple)) and batch:
        return batch[0]
    raise TypeError("recal.torch: cannot tell the model's inputs in a batch of type %s; give "
                    "input_fn=lambda batch: (the forward's positional inputs)" % type(batch).__name__)


def _forward_keywords(model):
    """(names the forward takes by keyword, in order; whether it takes **kwargs), or None
    when its signature cannot be read."""
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (AttributeError, TypeError, ValueError):  # AttributeError: an ExportedProgram
        return None
    names = [p.name for p in parameters
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    return names, any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)


def _keyword_order(model, batch, only_taken):
    """The keys of a dict batch that become inputs, in a fixed order: the forward's own
    order, then (for **kwargs) the rest sorted. only_taken: leave out keys the forward does
    not take (labels and the like)."""
    signature = _forward_keywords(model)
    if signature is None:
        return tuple(sorted(batch))
    names, var_keyword = signature
    keys = [n for n in names if n in batch]
    rest = sorted(k for k in batch if k not in names)
    if var_keyword or not only_taken:
        keys += rest
    if not keys:
        raise TypeError("recal.torch: the forward takes none of the batch's keys %s; give "
                        "input_fn" % sorted(batch))
    return tuple(keys)


def _wire(value, what):
    """A CPU tensor the API carries: float32, float16 and uint8 as they are (compact on the
    wire), float64 and bfloat16 as float32."""
    if not isinstance(value, torch.Tensor):
        raise TypeError("recal.torch: %s is a %s, not a tensor; give input_fn" % (what, type(value).__name__))
    value = value.detach()
    if value.dtype in (torch.float64, torch.bfloat16):
        value = value.float()
    if value.dtype not in _WIRE:
        raise TypeError("recal.torch: %s is %s; the server takes float32, float16 and uint8 inputs"
                        % (what, value.dtype))
    if value.dim() == 0 or value.numel() == 0:
        raise ValueError("recal.torch: %s of shape %s has no batch dimension or no values"
                         % (what, tuple(value.shape)))
    return value.cpu().contiguous()


def _local_batches(data, input_fn, model):
    """(tuple of CPU wire tensors, keys or None) per batch of `data`."""
    take = input_fn or _default_input_fn
    keys = None
    for index, batch in enumerate(data):
        inputs = take(batch)
        if isinstance(inputs, Mapping):
            if index == 0:
                keys = _keyword_order(model, inputs, only_taken=input_fn is None)
            missing = [k for k in keys if k not in inputs]
            if missing or (input_fn is not None and set(inputs) != set(keys)):
                raise ValueError("recal.torch: batch %d has keys %s; the first had %s"
                                 % (index, sorted(inputs), list(keys)))
            values = [(inputs[k], "input %r of batch %d" % (k, index)) for k in keys]
        else:
            if index > 0 and keys is not None:
                raise ValueError("recal.torch: batch %d is not a dict like the first" % index)
            items = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
            values = [(x, "input %d of batch %d" % (i, index)) for i, x in enumerate(items)]
        tensors = tuple(_wire(x, what) for x, what in values)
        if len({t.shape[0] for t in tensors}) != 1:
            raise ValueError("recal.torch: the inputs of batch %d differ in dim 0: %s"
                             % (index, [tuple(t.shape) for t in tensors]))
        yield tensors, keys


def _arrays(batches):
    """What the client pushes: numpy arrays."""
    for tensors, _ in batches:
        yield tuple(t.numpy() for t in tensors)


def _example(tensors, scale, mean, std, dtype=torch.float32):
    """The first batch as the server's forward will see it: normalised, in the floating dtype
    of the model's parameters (the server casts what it is sent to the dtype the exported
    program takes; a float32 example would record a float64 model's program as taking
    float32, which its convolutions then refuse)."""
    out = []
    for t in tensors:
        x = t.float()
        if scale:
            x = x / scale
        if mean:
            shape = [1, -1] + [1] * (x.dim() - 2)
            x = (x - torch.tensor(mean).view(shape)) / torch.tensor(std).view(shape)
        out.append(x.to(dtype))
    return out


def _floating_dtype(model):
    """The dtype of the model's first floating-point parameter or buffer (float32 if none)."""
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.is_floating_point():
            return t.dtype
    return torch.float32


# ------------------------------------------------------------------------------ results

def _named_buffers(model):
    """{state_dict key: buffer} of a module, or of an ExportedProgram (its state_dict's
    tensors are what its module() runs with)."""
    if isinstance(model, torch.export.ExportedProgram):
        return {k: model.state_dict[k] for k in model.graph_signature.buffers if k in model.state_dict}
    return dict(model.named_buffers())


def _load_buffers(model, buffers, prefix):
    """Copies the downloaded statistics into `model` (all or none): every BatchNorm's
    running_mean / running_var must be there and every downloaded key must be a buffer of
    the model with its shape. Returns the keys loaded."""
    mapped = {}
    for key, value in buffers.items():
        if not key.startswith(prefix):
            raise RecalError(grpc.StatusCode.INTERNAL, "the server returned %r, outside the model" % key)
        mapped[key[len(prefix):]] = value
    own = _named_buffers(model)
    eager = not isinstance(model, (torch.jit.ScriptModule, torch.export.ExportedProgram))
    expected = _bn_keys(model) if eager else set(mapped)
    missing = sorted(expected - set(mapped))
    unexpected = sorted(k for k in mapped if k not in own)
    wrong = sorted(k for k in mapped if k in own and tuple(own[k].shape) != tuple(mapped[k].shape))
    if missing or unexpected or wrong:
        raise RecalError(grpc.StatusCode.INTERNAL, "the server's BatchNorm buffers do not fit the model "
                         "(nothing loaded): missing %s, unexpected %s, wrong shape %s"
                         % (missing, unexpected, wrong))
    with torch.no_grad():
        for key, value in mapped.items():
            own[key].copy_(value.to(own[key].dtype))
    return tuple(sorted(mapped))


# -------------------------------------------------------------------------- distributed


def _shard(shard):
    """(rank, world, gloo group) for this call; world 1: no collectives."""
    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    if shard is None:
        if not initialised or dist.get_world_size() == 1:
            return 0, 1, None
        shard = (dist.get_rank(), dist.get_world_size())
    rank, world = (int(v) for v in shard)
    if world < 1 or not 0 <= rank < world:
        raise ValueError("shard=(rank, world) needs 0 <= rank < world, got %r" % (shard,))
    if world == 1:
        return 0, 1, None
    if not initialised:
        raise ValueError("shard=(%d, %d): the ranks' batches are gathered with torch.distributed, "
                         "which is not initialised" % (rank, world))
    if (rank, world) != (dist.get_rank(), dist.get_world_size()):
        raise ValueError("shard=(%d, %d) is not this process's (rank %d of %d in torch.distributed)"
                         % (rank, world, dist.get_rank(), dist.get_world_size()))
    return rank, world, _gloo_group()


_GLOO = {}


def _gloo_group():
    """The default group if it is gloo, else one gloo group over every rank (made once, by
    every rank, on their first call)."""
    dist = torch.distributed
    if dist.get_backend() == "gloo":
        return None
    if "group" not in _GLOO:
        _GLOO["group"] = dist.new_group(backend="gloo")
    return _GLOO["group"]


def _broadcast_outcome(outcome, group):
    box = [outcome]
    torch.distributed.broadcast_object_list(box, src=0, group=group)
    return box[0]


# ------------------------------------------------------------------------------ progress


def _progress_handler(progress, bar, total):
    """on_progress for the client: the caller's callback, and a tqdm bar when tqdm is
    installed (bar=None) or asked for (bar=True), else log lines (logger "recal.torch", INFO;
    bar=False: neither); returns (handler, close)."""
    tqdm = None
    if bar or bar is None:
        try:
            from tqdm import tqdm
        except ImportError:
            if bar:
                warnings.warn("recal.torch: bar=True but tqdm is not installed")
    lines = _ProgressLog() if tqdm is None and bar is not False else None
    # The bar appears with the job's first progress: before it (export, upload, a server
    # that does not answer) a bar would sit at 0/N saying nothing true.
    meter = []

    def handle(p):
        if tqdm is not None:
            if not meter:
                meter.append(tqdm(total=p.batches_total or total, desc="recal", unit="batch"))
            if p.batches_total and meter[0].total != p.batches_total:
                meter[0].total = p.batches_total
            meter[0].update(p.batches_done - meter[0].n)
        if lines is not None:
            lines.update(p)
        if progress is not None:
            progress(p)

    def close():
        if meter:
            meter[0].close()
        if lines is not None:
            lines.close()

    return handle, close


# Between two progress log lines, so that a long job does not log every batch.
_LOG_EVERY_SECONDS = 5.0


class _ProgressLog:
    """Progress as log lines when there is no tqdm bar: the first batch, then at most one
    line every _LOG_EVERY_SECONDS, and the last batch when the job ends. Logged at INFO on
    "recal.torch" (quiet it with logging.getLogger("recal").setLevel(logging.WARNING))."""

    def __init__(self):
        _show_info_when_logging_is_unconfigured()
        self.last = None  # the last JobProgress seen
        self.logged = None  # batches_done of the last line
        self.logged_at = 0.0

    def update(self, p):
        self.last = p
        if p.batches_done and (self.logged is None or time.monotonic() - self.logged_at >= _LOG_EVERY_SECONDS):
            self._line(p)

    def close(self):
        if self.last is not None and self.last.batches_done != self.logged:
            self._line(self.last)

    def _line(self, p):
        self.logged, self.logged_at = p.batches_done, time.monotonic()
        total = "/%d" % p.batches_total if p.batches_total else ""
        _log.info("recal: batch %d%s, %d samples, %.1f samples/s", p.batches_done, total, p.samples_done,
                  p.samples_per_second)


def _wait_logger(job_word="job"):
    """on_queued for the client: logs why the job waits (Job.wait), once, on "recal.torch" at
    INFO, unless it is only the moment before an idle worker takes it (STARTING)."""
    logged = [False]

    def log_wait(wait):
        if logged[0] or wait.cause == recal_pb2.JobWait.STARTING:
            return
        logged[0] = True
        _show_info_when_logging_is_unconfigured()
        _log.info("recal: the %s waits: %s", job_word, wait.reason)

    return log_wait


def _show_info_when_logging_is_unconfigured():
    """Without any logging configuration Python shows WARNING and above only, so progress
    lines would be lost: then (and only then) the "recal" logger gets a stderr handler at
    INFO, as PyTorch Lightning does for its own. A program that configured logging, or set
    the "recal" logger's level, keeps what it chose."""
    package = logging.getLogger("recal")
    if logging.getLogger().handlers or package.handlers or package.level != logging.NOTSET:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    package.propagate = False


# --------------------------------------------------------------------------- recalibrate

# The engine options recalibrate() sets from its own arguments (iterations is one of those
# arguments: given to recal.lightning's callback, it reaches recalibrate() by name).
_MANAGED = ("max_batches", "allow_short_data")
_MAX_ITERATIONS = 20  # common/request_limits.h kMaxIterations
# What **engine_options may hold besides the engine's own options: the job's (submit's).
_JOB_OPTIONS = ("priority", "timeout_seconds", "labels", "request_id", "batch_size")


def check_options(options, also=()):
    """TypeError for a name recalibrate() does not take (a typo such as estimater: "did you
    mean 'estimator'?"), before anything is exported or sent. `also`: the caller's own
    keyword names (recal.lightning's), offered as corrections too."""
    own = [name for name in inspect.signature(recalibrate).parameters if name not in ("model", "data", "engine_options")]
    engine = [name for name in specs.ENGINE_OPTIONS if name not in _MANAGED]
    managed = sorted(set(options) & set(_MANAGED))
    if managed:
        raise TypeError("recal.torch.recalibrate sets %s itself (give num_batches; fewer batches "
                        "are always allowed)" % ", ".join(managed))
    specs.check_names(options, set(own + engine + list(_JOB_OPTIONS) + list(also)), "recal.torch option")


def recalibrate(model, data, *, server=None, num_batches=200, input_fn=None, token=None, tls=False,
                tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None, timeout=None,
                progress=None, bar=None, export="auto", shard=None, scale=None, mean=None, std=None,
                iterations=1, **engine_options):
    """Recalibrates the BatchNorm statistics of `model` in place on recal-server and returns
    a Result (result.report is the job's RunReport).

    model: an eager nn.Module (or a ScriptModule or torch.export ExportedProgram, sent as
        they are, their buffers updated in place; DistributedDataParallel / DataParallel
        are unwrapped), on any device, in train or eval mode: both stay as they are.
    data: any iterable of batches (a DataLoader); the first num_batches are used. Fewer:
        what there is, with a ShortDataWarning and result.short_data.
    input_fn(batch): the forward's inputs for a batch: a tensor, a tuple/list of positional
        tensors, or a dict of keyword tensors. Default: a tensor as is, a tuple/list's first
        element (as fvcore does), a dict's tensors as keyword arguments for the parameters
        the forward takes (other keys, e.g. labels, are left out). Keyword inputs go through
        a small adapter module whose forward takes them positionally, in a fixed order.
        Inputs travel as float32, float16 or uint8 (float16 and uint8 as they are: 2 and 1
        bytes a value; float64 / bfloat16 become float32; other dtypes are refused), and
        the server's forward gets them as float32, after scale / mean / std when given
        ((x / scale - mean) / std per channel, dim 1).
    server: "host:port" or a recal.Client; None: $RECAL_SERVER, else localhost:50051.
        token (None: $RECAL_TOKEN), tls, tls_ca, tls_cert, tls_key, tls_server_name,
        timeout: as for recal.Client (unused when server is a Client). A server that does
        not answer within a few seconds raises RecalError(UNAVAILABLE) saying what to do.
    progress(JobProgress): called as the job goes (batches_done, samples_done, ...); a tqdm
        bar is shown when tqdm is installed (bar=None), else progress lines are logged
        (logger "recal.torch", INFO: batches, samples, samples/s; shown on stderr when the
        program configured no logging); bar=False: neither. A job that waits in the queue
        logs why, once, on the same logger (Job.wait.reason).
    export: "auto": torch.export.export of a CPU copy in the model's own train/eval modes,
        dim 0 of every input dynamic (one size, >= 1), saved with torch.export.save; when
        export fails (data-dependent control flow, ...) torch.jit.script, and when that
        fails torch.jit.trace on the first batch (TorchScript, deprecated since PyTorch
        2.11; no deprecation warning comes from these calls). "export", "script" or
        "trace": that method alone, raising its failure. result.export says which was
        used, result.export_error why the ones before it failed.
    engine_options: estimator ("population" | "batch_average"), modules ("eval" | "train"
        | "as_saved"), include, exclude, target_rel_error; also priority, timeout_seconds,
        labels, request_id, and batch_size (what the report says; default the first
        batch's size, which must be within the server's --max_batch_size).
    iterations: K passes, each a job over the same first num_batches batches of `data`
        (which must be iterable again: a DataLoader or a list, not an iterator), each after
        the first run on the model with the statistics of the one before loaded (a job's
        data is pushed once: the engine option iterations needs data the server reads). For
        models whose forward reads the running statistics (torch.ao's QAT ConvBn modules
        scale their weight by the running variance before fake-quantizing it), where one
        pass is one re-estimation step; result.iterations says how far each moved them.
    shard: (rank, world). With torch.distributed initialised and world > 1 every rank calls
        this with its own batches: rank 0 exports the model (with its first batch), uploads
        it and submits one job of `world` shards; every rank pushes its own batches into its
        shard (rank r at most its part of num_batches: num_batches*(r+1)//world -
        num_batches*r//world), so every rank talks to the server; the statistics are
        merged exactly on the server and broadcast from rank 0, so every rank loads the same
        ones and gets the same Result. A rank whose data fails stops every rank and the job.
        Default: from torch.distributed when it is initialised; (0, 1): this process alone,
        without collectives.

    Raises RecalError (job failed or cancelled, server errors; nothing is loaded then),
    ValueError / TypeError for data it cannot push (checked before anything is uploaded
    for the first batch).
    """
    check_options(engine_options)
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError("num_batches must be a positive integer, not %r" % (num_batches,))
    if isinstance(iterations, bool) or not isinstance(iterations, int) or not 1 <= iterations <= _MAX_ITERATIONS:
        raise ValueError("iterations must be an integer from 1 to %d, not %r" % (_MAX_ITERATIONS, iterations))
    if iterations > 1 and iter(data) is data:
        raise ValueError("recal.torch: iterations=%d reads the data once per pass, and an iterator is read "
                         "once: give a DataLoader or a list" % iterations)
    if bool(mean) != bool(std):
        raise ValueError("give mean and std together")
    target = _unwrap(model)
    rank, world, group = _shard(shard)
    local = _local_batches(data, input_fn, target)
    connect = dict(server=server, token=token, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert,
                   tls_key=tls_key, tls_server_name=tls_server_name, timeout=timeout)
    job_options = dict(num_batches=num_batches, progress=progress, bar=bar, export=export,
                       scale=scale, mean=mean, std=std, options=engine_options)
    if world == 1 and iterations > 1:
        return _passes(target, lambda: _local_batches(data, input_fn, target), connect, iterations, job_options)
    if world == 1:
        outcome = _run(target, local, connect, **job_options)
        return _finish(target, outcome, ranks=1)
    if iterations > 1:
        raise ValueError("recal.torch: iterations > 1 with torch.distributed: run the passes in one process")

    return _finish(target, _run_sharded(target, local, connect, rank, world, group, **job_options), ranks=world)


def _pass_movement(report):
    """(worst mean shift in std, worst |var ratio - 1|) over the report's layers."""
    shift = change = 0.0
    for layer in report.layers:
        if layer.used and not layer.excluded and layer.HasField("var_ratio"):
            shift = max(shift, layer.mean_shift_in_std.max)
            change = max(change, abs(layer.var_ratio.max - 1), abs(layer.var_ratio.min - 1))
    return shift, change


def _passes(target, batches_of_a_pass, connect, iterations, job_options):
    """recalibrate(iterations=K): K jobs, each loading its statistics into `target` before the
    next exports it; the last pass's Result with every pass's movement."""
    passes = []
    for _ in range(iterations):
        result = _finish(target, _run(target, batches_of_a_pass(), connect, **job_options), ranks=1)
        shift, change = _pass_movement(result.report)
        passes.append(Pass(report=result.report, max_mean_shift_in_std=shift, max_var_change=change))
    return dataclasses.replace(result, iterations=tuple(passes))


def _connect(connect):
    """(client, whether it is ours to close)."""
    client = connect["server"]
    if isinstance(client, Client):
        return client, False
    return Client(client, token=connect["token"], timeout=connect["timeout"], tls=connect["tls"],
                  tls_ca=connect["tls_ca"], tls_cert=connect["tls_cert"], tls_key=connect["tls_key"],
                  tls_server_name=connect["tls_server_name"]), True


def _all_gather(item, world, group):
    out = [None] * world
    torch.distributed.all_gather_object(out, item, group=group)
    return out


def _stopped(items, rank):
    """The errors among every rank's `items` (("error", why) or anything else), as one
    exception for this rank: rank 0 names them, the others say rank 0 stopped them."""
    errors = [item[1] for item in items if item[0] == "error"]
    if not errors:
        return None
    if rank == 0:
        return RuntimeError("recal.torch: " + "; ".join(errors))
    return RuntimeError("recal.torch: stopped by rank 0: " + "; ".join(errors))


def _raise_remote(outcome):
    _, code, message = outcome
    if code is not None:
        raise RecalError(code, "rank 0: " + message)
    raise RuntimeError("recal.torch: rank 0: " + message)


def _export_and_upload(client, target, first, directory, export, scale, mean, std):
    """Exports `target` with the first batch (as the server's forward will see it) and
    uploads the archive: (_Archive, Model)."""
    # A server that is not there fails in seconds, before the export's time is spent.
    client._check_reachable()
    tensors, keys = first
    dtype = _floating_dtype(target) if isinstance(target, torch.nn.Module) else torch.float32
    archive = _export(target, _example(tensors, scale, mean, std, dtype), keys, directory, export)
    name = type(target).__name__ + os.path.splitext(archive.path)[1]
    return archive, client.upload_model(archive.path, name=name)


def _run_sharded(target, local, connect, rank, world, group, num_batches, progress, bar, export, scale,
                 mean, std, options):
    """One job of `world` shards, each rank pushing its own batches into its shard; the
    outcome as _run's, the same on every rank."""
    share = num_batches * (rank + 1) // world - num_batches * rank // world
    mine = itertools.islice(local, share)
    try:
        first = next(mine, None)
        ready = ("ready", None if first is None else first[1], first is not None)
    except Exception as error:  # noqa: BLE001 (every rank learns of it)
        first, ready = None, ("error", "rank %d: %s: %s" % (rank, type(error).__name__, error))
    items = _all_gather(ready, world, group)
    stop = _stopped(items, rank)
    if stop is None and items[0][0] == "ready" and not items[0][2]:
        stop = RuntimeError("recal.torch: %sthe data yielded no batches" % ("" if rank == 0 else "rank 0: "))
    keys = {item[1] for item in items if item[0] == "ready" and item[2]}
    if stop is None and len(keys) > 1:
        stop = RuntimeError("recal.torch: ranks' batches differ: inputs %s" % sorted(map(str, keys)))
    if stop is not None:
        raise stop

    client, owned = _connect(connect)
    handle, close_bar = _progress_handler(progress, bar, num_batches)
    try:
        with tempfile.TemporaryDirectory(prefix="recal-torch-") as tmp:
            # Rank 0 makes the job; every rank learns its id (or why there is none).
            job = archive = model = None
            if rank == 0:
                try:
                    tensors, _ = first
                    archive, model = _export_and_upload(client, target, first, tmp, export, scale, mean, std)
                    source = recal_pb2.ClientStreamSource(scale=scale or 0, mean=mean or [], std=std or [])
                    submit = dict(options)
                    batch_size = submit.pop("batch_size", None) or max(1, tensors[0].shape[0])
                    job = client.submit(model, source, batch_size=batch_size,
                                        max_batches=-(-num_batches // world), allow_short_data=True,
                                        shards=world, **submit)
                    made = ("job", job.id)
                except BaseException as error:
                    made = ("error", error.code.name if isinstance(error, RecalError) else None,
                            error.message if isinstance(error, RecalError) else "%s: %s" % (type(error).__name__, error))
                    _broadcast_outcome(made, group)
                    raise
                _broadcast_outcome(made, group)
                job_id = job.id
            else:
                made = _broadcast_outcome(None, group)
                if made[0] == "error":
                    _raise_remote(made)
                job_id = made[1]

            # Every rank its own shard.
            pushed = [0]
            ended = [False]

            def counted():
                for batch in itertools.chain([first], mine):
                    pushed[0] += 1
                    yield batch
                ended[0] = True

            try:
                client.push(job_id, _arrays(counted()), shard=rank)
                done = ("pushed", pushed[0], ended[0])
            except RecalError as error:
                # FAILED_PRECONDITION / CANCELLED: the shard took what it needed, or the job ended.
                if error.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED):
                    done = ("pushed", pushed[0], ended[0])
                else:
                    done = ("error", "rank %d: %s" % (rank, error))
            except Exception as error:  # noqa: BLE001 (every rank learns of it)
                done = ("error", "rank %d: %s: %s" % (rank, type(error).__name__, error))
            items = _all_gather(done, world, group)
            stop = _stopped(items, rank)
            if stop is not None:
                if rank == 0:
                    try:
                        client.cancel(job_id)
                    except RecalError:
                        pass
                raise stop
            total = sum(item[1] for item in items)
            short = all(item[2] for item in items) and total < num_batches

            # Rank 0 follows the job and hands the statistics to every rank.
            if rank != 0:
                outcome = _broadcast_outcome(None, group)
                if outcome[0] == "error":
                    _raise_remote(outcome)
                return outcome
            try:
                ended_job = client.wait(job_id, on_progress=handle, on_queued=_wait_logger("sharded job"))
                if ended_job.state != recal_pb2.SUCCEEDED:
                    raise RecalError.from_job(ended_job)
                bn_path, report_path = os.path.join(tmp, "bn.safetensors"), os.path.join(tmp, "report.json")
                client.download(ended_job, bn_path, "bn")
                client.download(ended_job, report_path, "report")
                buffers = read_safetensors(bn_path, to="torch")
                with open(report_path) as f:
                    report = f.read()
            except BaseException as error:
                _broadcast_outcome(("error", error.code.name if isinstance(error, RecalError) else None,
                                    error.message if isinstance(error, RecalError)
                                    else "%s: %s" % (type(error).__name__, error)), group)
                raise
            facts = dict(model_id=model.id, export=archive.how, export_error=archive.error, batches=total,
                         num_batches=num_batches, short=short, prefix=archive.prefix,
                         job=ended_job.SerializeToString())
            outcome = ("ok", buffers, report, facts)
            _broadcast_outcome(outcome, group)
            return outcome
    finally:
        close_bar()
        if owned:
            client.close()


def _run(target, batches, connect, num_batches, progress, bar, export, scale, mean, std, options):
    """Export, upload, job, push, download: ("ok", {key: tensor}, report JSON, facts)."""
    batches = iter(batches)
    first = next(batches, None)
    if first is None:
        raise ValueError("recal.torch: the data yielded no batches")
    pushed = [0]
    ended = [False]  # the data ran out (rather than the job taking no more)

    def counted():
        for batch in itertools.chain([first], batches):
            pushed[0] += 1
            yield batch
        ended[0] = True

    client, owned = _connect(connect)
    handle, close_bar = _progress_handler(progress, bar, num_batches)
    try:
        with tempfile.TemporaryDirectory(prefix="recal-torch-") as tmp:
            archive, model = _export_and_upload(client, target, first, tmp, export, scale, mean, std)
            bn_path, report_path = os.path.join(tmp, "bn.safetensors"), os.path.join(tmp, "report.json")
            job = client.recalibrate_stream(model, _arrays(counted()), max_batches=num_batches,
                                            allow_short_data=True, bn_out=bn_path, report=report_path,
                                            on_progress=handle, on_queued=_wait_logger(), scale=scale,
                                            mean=mean, std=std, **options)
            buffers = read_safetensors(bn_path, to="torch")
            with open(report_path) as f:
                report = f.read()
    finally:
        close_bar()
        if owned:
            client.close()
    facts = dict(model_id=model.id, export=archive.how, export_error=archive.error, batches=pushed[0],
                 num_batches=num_batches, short=ended[0] and pushed[0] < num_batches, prefix=archive.prefix,
                 job=job.SerializeToString())
    return ("ok", buffers, report, facts)


def _finish(target, outcome, ranks):
    _, buffers, report, facts = outcome
    loaded = _load_buffers(target, buffers, facts["prefix"])
    short = facts["short"]
    if short:
        warnings.warn("recal.torch: the data had %d batches, fewer than num_batches=%d; used them all"
                      % (facts["batches"], facts["num_batches"]), ShortDataWarning, stacklevel=3)
    return Result(report=parse_report(report), job=recal_pb2.Job.FromString(facts["job"]),
                  model_id=facts["model_id"], export=facts["export"], export_error=facts["export_error"],
                  batches=facts["batches"], num_batches=facts["num_batches"], short_data=short,
                  buffers=loaded, ranks=ranks)


# ------------------------------------------------------------------------------ drop-ins


class PreciseBN:
    """The detectron2 / fast-reid PreciseBN hook on recal-server (duck-typed HookBase: no
    detectron2 import). Register it with the trainer, which sets `hook.trainer`;
    after_step() recalibrates `model` every `period` iterations (period <= 0: only at the
    end) and after the last one, reading trainer.iter and trainer.max_iter, on `num_iter`
    batches of `data_loader` (one iterator kept across calls, restarted when it ends).
    Disabled (with a log line) when the model has no BatchNorm in train mode. Other keyword
    arguments go to recalibrate() (token, input_fn, tls options, estimator, ...). The last
    Result is in `last_result`."""

    def __init__(self, period, model, data_loader, num_iter, *, server=None, token=None, **options):
        self._period = period
        self._model = model
        self._data_loader = data_loader
        self._num_iter = num_iter
        check_options(options)
        self._options = dict(options, server=server, token=token)
        self._data_iter = None
        self.trainer = None
        self.last_result = None
        self._disabled = not _has_training_bn(model)
        if self._disabled:
            _log.info("PreciseBN is disabled: the model has no BatchNorm layer in train mode")

    def before_train(self):
        pass

    def after_train(self):
        pass

    def before_step(self):
        pass

    def after_backward(self):
        pass

    def after_step(self):
        next_iter = self.trainer.iter + 1
        is_final = next_iter == self.trainer.max_iter
        if is_final or (self._period > 0 and next_iter % self._period == 0):
            self.update_stats()

    def state_dict(self):
        return {}

    def _batches(self):
        restarted = False
        while True:
            if self._data_iter is None:
                self._data_iter = iter(self._data_loader)
            try:
                batch = next(self._data_iter)
            except StopIteration:
                self._data_iter = None
                if restarted:
                    return  # the loader yields nothing
                restarted = True
                continue
            restarted = False
            yield batch

    def update_stats(self):
        """Recalibrates now; returns the Result (None when disabled)."""
        if self._disabled:
            return None
        _log.info("Running precise-BN on recal-server for %d iterations", self._num_iter)
        self.last_result = recalibrate(self._model, self._batches(), num_batches=self._num_iter,
                                       **self._options)
        return self.last_result


def do_precise_bn(model, data_loader, num_iters=200, *, server=None, estimator="batch_average", **options):
    """PaddleVideo's do_preciseBN on recal-server: the BatchNorm layers of `model` get
    statistics from `num_iters` batches of `data_loader`, estimator "batch_average" (the
    mean of the batch means and of the unbiased batch variances, as its loop averages them;
    "population" for the exact statistics of all samples). Like it, does nothing (returns
    None) when no BatchNorm layer is in train mode. Other keyword arguments go to
    recalibrate(); returns its Result."""
    if not _has_training_bn(model):
        return None
    return recalibrate(model, data_loader, server=server, num_batches=num_iters, estimator=estimator,
                       **options)
