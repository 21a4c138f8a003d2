"""Data specs, engine options, states and artifacts: Python values -> recal.v1 messages.

Data specs are the strings recal-run and the server use (server-side paths):
    npy:PATH
    safetensors:PATH[:KEY,KEY...]   keys start after the last ':' (a PATH containing ':'
                                    needs a trailing ':', "safetensors:/a:b.st:")
    torch:PATH
    synthetic:SHAPE[,seed=S]        per-sample SHAPE such as 3x224x224
"""

import grpc

from recal._proto.recal.v1 import recal_pb2, report_pb2
from recal.errors import RecalError

_SYNTAX = "expected npy:PATH, safetensors:PATH[:KEY,KEY...], torch:PATH or synthetic:SHAPE[,seed=S]"


def _bad(spec, why):
    return RecalError(grpc.StatusCode.INVALID_ARGUMENT, "bad data spec %r: %s" % (spec, why))


def _digits(text):
    return text != "" and all("0" <= c <= "9" for c in text)


def data_source(data):
    """A DataSource message for a spec string or a message (DataSource, TensorFileSource,
    SyntheticSource, ClientStreamSource). Bad specs raise RecalError(INVALID_ARGUMENT)."""
    if isinstance(data, recal_pb2.DataSource):
        out = recal_pb2.DataSource()
        out.CopyFrom(data)
        return out
    if isinstance(data, recal_pb2.TensorFileSource):
        return recal_pb2.DataSource(tensor_file=data)
    if isinstance(data, recal_pb2.SyntheticSource):
        return recal_pb2.DataSource(synthetic=data)
    if isinstance(data, recal_pb2.ClientStreamSource):
        return recal_pb2.DataSource(client_stream=data)
    if not isinstance(data, str):
        raise TypeError("data must be a spec string or a recal DataSource message, not %s"
                        % type(data).__name__)
    scheme, colon, rest = data.partition(":")
    if not colon:
        raise _bad(data, "no scheme; " + _SYNTAX)
    if scheme == "synthetic":
        parts = rest.split(",")
        shape = []
        for dim in parts[0].split("x") if parts[0] else []:
            if not _digits(dim) or int(dim) < 1:
                raise _bad(data, "SHAPE %r must be positive integers joined by 'x' (e.g. 3x224x224)"
                           % parts[0])
            shape.append(int(dim))
        if not shape:
            raise _bad(data, "synthetic needs a per-sample SHAPE such as 3x224x224")
        seed = 0
        for option in parts[1:]:
            if not option.startswith("seed=") or not _digits(option[5:]) or len(parts) > 2:
                raise _bad(data, "unknown or repeated option %r; the only option is seed=S" % option)
            seed = int(option[5:])
        return recal_pb2.DataSource(synthetic=recal_pb2.SyntheticSource(sample_shape=shape, seed=seed))
    formats = {"npy": recal_pb2.TensorFileSource.NPY,
               "safetensors": recal_pb2.TensorFileSource.SAFETENSORS,
               "torch": recal_pb2.TensorFileSource.TORCH}
    if scheme not in formats:
        raise _bad(data, "unknown scheme %r; %s" % (scheme, _SYNTAX))
    keys = []
    if scheme == "safetensors" and ":" in rest:
        rest, _, key_list = rest.rpartition(":")
        if key_list:
            keys = key_list.split(",")
            if "" in keys:
                raise _bad(data, "empty key in the key list (KEY,KEY...)")
    if not rest:
        raise _bad(data, "empty path after '%s:'" % scheme)
    return recal_pb2.DataSource(tensor_file=recal_pb2.TensorFileSource(
        format=formats[scheme], path=rest, keys=keys))


def _enum(enum, value, names, what):
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in enum.values():
            raise ValueError("%s %d is not one of %s" % (what, value, sorted(names)))
        return value
    if isinstance(value, str) and value.lower() in names:
        return names[value.lower()]
    raise ValueError("%s %r is not one of %s" % (what, value, ", ".join(sorted(names))))


_ESTIMATORS = {"population": report_pb2.POPULATION, "batch_average": report_pb2.BATCH_AVERAGE}
_MODULES = {"eval": report_pb2.EVAL, "train": report_pb2.TRAIN, "as_saved": report_pb2.AS_SAVED}
ENGINE_OPTIONS = ("estimator", "modules", "include", "exclude", "max_batches", "allow_short_data",
                  "target_rel_error")


def engine_options(**options):
    """EngineOptions from keyword arguments (None: the server's default):
    estimator "population" | "batch_average", modules "eval" | "train" | "as_saved",
    include / exclude (regular expressions searched in layer names), max_batches,
    allow_short_data, target_rel_error."""
    unknown = sorted(set(options) - set(ENGINE_OPTIONS))
    if unknown:
        raise TypeError("unknown engine option(s) %s; expected %s"
                        % (", ".join(unknown), ", ".join(ENGINE_OPTIONS)))
    out = recal_pb2.EngineOptions()
    values = {k: v for k, v in options.items() if v is not None}
    if "estimator" in values:
        out.estimator = _enum(report_pb2.Estimator, values.pop("estimator"), _ESTIMATORS, "estimator")
    if "modules" in values:
        out.modules = _enum(report_pb2.ModuleMode, values.pop("modules"), _MODULES, "modules")
    for key, value in values.items():
        setattr(out, key, value)
    return out


_STATES = {name.lower(): number for name, number in recal_pb2.JobState.items() if number}


def job_state(value):
    """JobState number for "queued" / "QUEUED" / recal.QUEUED."""
    return _enum(recal_pb2.JobState, value, _STATES, "job state")


_ARTIFACTS = {"model": recal_pb2.MODEL, "bn": recal_pb2.BN_BUFFERS,
              "bn_buffers": recal_pb2.BN_BUFFERS, "report": recal_pb2.REPORT}


def artifact(value):
    """Artifact number for "model" | "bn" | "report" (or the enum)."""
    return _enum(recal_pb2.Artifact, value, _ARTIFACTS, "artifact")
