"""Data specs, engine options, states and artifacts: Python values -> recal.v1 messages.

Data specs are the strings recal-run and the server use (server-side paths); the same
syntax as the C++ client's (common/data_spec.h):
    npy:PATH[?NORM]
    safetensors:PATH[:KEY,KEY...][?NORM]
                                    keys start after the last ':' (a PATH containing ':'
                                    needs a trailing ':', "safetensors:/a:b.st:")
    torch:PATH[?NORM]
        NORM = scale=S&mean=M,M,..&std=S,S,.. (each optional; mean and std together, one
        value per channel of dim 1): the server turns uint8 / float16 inputs into float32
        (x / S - mean) / std. Options start at the last '?', so a PATH containing '?' needs
        a trailing '?' ("npy:/d/what?.npy?").
    synthetic:SHAPE[,seed=S]        per-sample SHAPE such as 3x224x224
    images:DIR[?resize=R&crop=C&mean=M,M,M&std=S,S,S&samples=N&seed=S&shuffle=0|1&on_bad=fail|skip]
                                    every .jpg/.jpeg/.png under DIR (recursively) through
                                    torchvision's Resize(R), CenterCrop(C), ToTensor,
                                    Normalize(mean, std); sorted by path (or shuffled with
                                    seed S), the first N (default all); on_bad=skip skips
                                    unreadable files instead of failing the job.
                                    1 <= C <= R <= 65536. Left out: ImageNet's transform
                                    (256, 224, its mean and std; the server fills it in).
                                    A DIR containing '?' needs a trailing '?'.
PATH and DIR may be s3://BUCKET/KEY: the ':' of "s3://" is never the one before the keys.
Options are KEY=VALUE joined by '&', each KEY once; empty ones ("DIR?", "a&&b") are ignored.
Numbers are finite decimals (255, -0.5, .5, 2e-3); integers are digits only. The C++ parser
and this one are tested against one table of cases, tests/data/data_spec_cases.json.
"""

import difflib
import math
import re
import struct

import grpc

from recal._proto.recal.v1 import recal_pb2, report_pb2
from recal.errors import RecalError

_SYNTAX = ("expected npy:PATH, safetensors:PATH[:KEY,KEY...], torch:PATH (each with an optional "
           "?scale=S&mean=M,..&std=S,..), synthetic:SHAPE[,seed=S] or "
           "images:DIR[?resize=R&crop=C&mean=M,M,M&std=S,S,S&samples=N&seed=S&shuffle=0|1&on_bad=fail|skip]")
# A number as the C++ parser reads it (common/data_spec.cc, ParseFinite): decimal, ASCII
# digits. Python's float() would also take "1_0", " 1", "inf" and other scripts' digits.
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_MAX_SIDE = 65536
_FLOAT32_RANGE = " (within float32's range: 0, or 1.4e-45 to 3.4e38 in magnitude)"
_MAX_SAMPLE_ELEMENTS = (1 << 31) - 1  # as the C++ parser (ParseShape)
_INT64_MAX = (1 << 63) - 1


def _bad(spec, why):
    return RecalError(grpc.StatusCode.INVALID_ARGUMENT, "bad data spec %r: %s" % (spec, why))


def _integer(text, high):
    """The integer 0..high that `text` spells in ASCII digits alone, or None.
    Leading zeros are read past (as the C++ parser does), and int() never sees more digits
    than `high` has (it refuses strings of over 4300 digits)."""
    if text == "" or not all("0" <= c <= "9" for c in text):
        return None
    significant = text.lstrip("0")
    if len(significant) > len(str(high)):
        return None
    value = int(significant or "0")
    return value if value <= high else None


def _number(text):
    """The number `text` spells if a float32 carries it (the API's type for scale, mean and
    std: beyond its range a value would arrive as infinity or as 0), or None."""
    if not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    if not math.isfinite(value):
        return None
    try:
        carried = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return None
    if not math.isfinite(carried) or (carried == 0 and value != 0):
        return None
    return value


def _seed(spec, text):
    seed = _integer(text, (1 << 64) - 1)
    if seed is None:
        raise _bad(spec, "seed %r must be a non-negative integer below 2^64" % text)
    return seed


def _numbers(spec, key, text, positive, count=0):
    """Comma-separated finite numbers (positive ones for std); `count` of them unless 0."""
    values = []
    for part in text.split(","):
        value = _number(part)
        if value is None or (positive and value <= 0):
            raise _bad(spec, "%s must be comma-separated %snumbers; found %r%s"
                       % (key, "positive " if positive else "", part, _FLOAT32_RANGE))
        values.append(value)
    if count and len(values) != count:
        raise _bad(spec, "%s must have %d values (one per RGB channel)" % (key, count))
    return values


def _options(spec, text):
    """{KEY: VALUE} of KEY=VALUE&KEY=VALUE..., each KEY once."""
    options = {}
    for option in text.split("&"):
        if option == "":  # "images:DIR?" or a doubled '&'
            continue
        key, eq, value = option.partition("=")
        if not eq:
            raise _bad(spec, "option %r is not KEY=VALUE" % option)
        if key in options:
            raise _bad(spec, "repeated option %r" % key)
        options[key] = value
    return options


def _normalization(spec, text, file):
    """The ?scale=S&mean=..&std=.. of a tensor file spec, into the TensorFileSource `file`."""
    if text == "":
        return
    for key, value in _options(spec, text).items():
        if key == "scale":
            scale = _number(value)
            if scale is None or scale <= 0:
                raise _bad(spec, "scale %r must be a positive number%s" % (value, _FLOAT32_RANGE))
            file.scale = scale
        elif key in ("mean", "std"):
            getattr(file, key).extend(_numbers(spec, key, value, key == "std"))
        else:
            raise _bad(spec, "unknown option %r; tensor files take scale, mean, std" % key)
    if len(file.mean) != len(file.std):
        raise _bad(spec, "mean has %d values and std %d; give both, one value per channel"
                   % (len(file.mean), len(file.std)))


def _shape(spec, text):
    """The per-sample SHAPE of a synthetic spec: positive int64s, at most 2^31 - 1 elements."""
    if text == "":
        raise _bad(spec, "synthetic needs a per-sample SHAPE such as 3x224x224")
    shape = []
    elements = 1
    for part in text.split("x"):
        dim = _integer(part, _INT64_MAX)
        if not dim:
            raise _bad(spec, "SHAPE %r must be positive integers joined by 'x' (e.g. 3x224x224); found %r"
                       % (text, part))
        if elements > _MAX_SAMPLE_ELEMENTS // dim:
            raise _bad(spec, "SHAPE %r has more than 2^31 elements per sample" % text)
        elements *= dim
        shape.append(dim)
    return shape


def _synthetic(spec, rest):
    parts = rest.split(",")
    shape = _shape(spec, parts[0])
    seed = None
    for option in parts[1:]:
        if not option.startswith("seed=") or seed is not None:
            raise _bad(spec, "unknown or repeated option %r; the only option is seed=S" % option)
        seed = _seed(spec, option[5:])
    seed = seed or 0
    # int64 in the API: seeds of 2^63 and above travel bit for bit, as from the C++ client.
    if seed > _INT64_MAX:
        seed -= 1 << 64
    return recal_pb2.DataSource(synthetic=recal_pb2.SyntheticSource(sample_shape=shape, seed=seed))


def _images(spec, rest):
    path, question, text = rest.rpartition("?")
    if not question:  # no options: ImageNet's transform, filled in by the server
        path, text = rest, ""
    if not path:
        raise _bad(spec, "empty directory after 'images:'")
    folder = recal_pb2.ImageFolderSource(path=path, on_bad=recal_pb2.ImageFolderSource.FAIL)
    options = _options(spec, text)
    for key, value in options.items():
        if key in ("resize", "crop", "samples"):
            number = _integer(value, _INT64_MAX if key == "samples" else _MAX_SIDE)
            if not number:
                raise _bad(spec, "%s %r must be a positive integer%s"
                           % (key, value, "" if key == "samples" else " <= %d" % _MAX_SIDE))
            setattr(folder, key, number)
        elif key in ("mean", "std"):
            getattr(folder, key).extend(_numbers(spec, key, value, key == "std", 3))
        elif key == "seed":
            folder.seed = _seed(spec, value)
        elif key == "shuffle":
            if value not in ("0", "1"):
                raise _bad(spec, "shuffle %r must be 0 or 1" % value)
            folder.shuffle = value == "1"
        elif key == "on_bad":
            if value not in ("fail", "skip"):
                raise _bad(spec, "on_bad %r must be fail or skip" % value)
            folder.on_bad = (recal_pb2.ImageFolderSource.SKIP if value == "skip"
                             else recal_pb2.ImageFolderSource.FAIL)
        else:
            raise _bad(spec, "unknown option %r; images takes resize, crop, mean, std, samples, seed, "
                       "shuffle, on_bad" % key)
    # What is left out (resize, crop, mean, std) stays unset: the server fills it with
    # ImageNet's evaluation transform (common/data_spec.h, FillImageNetDefaults).
    if folder.crop and folder.resize and folder.crop > folder.resize:
        raise _bad(spec, "crop %d is larger than resize %d (padding is not supported)"
                   % (folder.crop, folder.resize))
    return recal_pb2.DataSource(image_folder=folder)


def data_source(data):
    """A DataSource message for a spec string or a message (DataSource, TensorFileSource,
    SyntheticSource, ClientStreamSource, ImageFolderSource). Bad specs raise
    RecalError(INVALID_ARGUMENT)."""
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
    if isinstance(data, recal_pb2.ImageFolderSource):
        return recal_pb2.DataSource(image_folder=data)
    if not isinstance(data, str):
        raise TypeError("data must be a spec string or a recal DataSource message, not %s"
                        % type(data).__name__)
    scheme, colon, rest = data.partition(":")
    if not colon:
        raise _bad(data, "no scheme; " + _SYNTAX)
    if scheme == "synthetic":
        return _synthetic(data, rest)
    if scheme == "images":
        return _images(data, rest)
    formats = {"npy": recal_pb2.TensorFileSource.NPY,
               "safetensors": recal_pb2.TensorFileSource.SAFETENSORS,
               "torch": recal_pb2.TensorFileSource.TORCH}
    if scheme not in formats:
        raise _bad(data, "unknown scheme %r; %s" % (scheme, _SYNTAX))
    norm = ""
    if "?" in rest:
        rest, _, norm = rest.rpartition("?")
    keys = []
    # The ':' of an s3:// URL is not the one before the keys.
    last = rest.rfind(":")
    if scheme == "safetensors" and last >= (5 if rest.startswith("s3://") else 0):
        rest, key_list = rest[:last], rest[last + 1:]
        if key_list:
            keys = key_list.split(",")
            if "" in keys:
                raise _bad(data, "empty key in the key list (KEY,KEY...)")
    if not rest:
        raise _bad(data, "empty path after '%s:'" % scheme)
    file = recal_pb2.TensorFileSource(format=formats[scheme], path=rest, keys=keys)
    _normalization(data, norm, file)
    return recal_pb2.DataSource(tensor_file=file)


def _enum(enum, value, names, what):
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in enum.values():
            raise ValueError("%s %d is not one of %s" % (what, value, sorted(names)))
        return value
    if isinstance(value, str) and value.lower() in names:
        return names[value.lower()]
    raise ValueError("%s %r is not one of %s" % (what, value, ", ".join(sorted(names))))


def _option_names(enum):
    """A proto enum's names as users write them: the value names in lowercase, UNSPECIFIED
    left out (as common/enum_names.h does for C++), so the proto is the one list."""
    return {name.lower(): number for name, number in enum.items() if not name.endswith("_UNSPECIFIED")}


def _enum_name(enum, value, names, what):
    """The lowercase name for a string-valued option given as a name or an enum number."""
    number = _enum(enum, value, names, what)
    return next(name for name, n in names.items() if n == number)


_ESTIMATORS = _option_names(report_pb2.Estimator)
_MODULES = _option_names(report_pb2.ModuleMode)
# Strings on the wire (JobOptions.compute_dtype / memory_format), spelled as these enums'.
_COMPUTE_DTYPES = _option_names(report_pb2.ComputeDtype)
_MEMORY_FORMATS = _option_names(report_pb2.MemoryFormat)
ENGINE_OPTIONS = ("estimator", "modules", "include", "exclude", "max_batches", "allow_short_data",
                  "target_rel_error", "compute_dtype", "memory_format", "iterations", "fold_batch_norm")


def check_names(given, known, what):
    """TypeError for the first name of `given` not in `known`, naming the nearest known one
    (a typo such as estimater is caught before anything is exported or sent)."""
    for name in sorted(set(given) - set(known)):
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = "; did you mean %r?" % near[0] if near else ""
        raise TypeError("unknown %s %r%s (expected one of %s)" % (what, name, hint, ", ".join(sorted(known))))


def engine_options(**options):
    """EngineOptions from keyword arguments (None: the server's default):
    estimator "population" | "batch_average", modules "eval" | "train" | "as_saved",
    include / exclude (regular expressions searched in layer names), max_batches,
    allow_short_data, target_rel_error, compute_dtype "float32" | "bfloat16" | "float16"
    (the forward's precision, under autocast; statistics stay float64), memory_format
    "auto" | "contiguous" | "channels_last", iterations (passes over the data, each with the
    statistics of the one before: for quantization-aware Conv-BN, whose forward reads them;
    data the server reads, not a client stream), fold_batch_norm (also make the "folded"
    artifact: the model in eval mode with each BatchNorm after a convolution or linear layer
    folded into it; torch.export programs). The names are those of the proto enums
    (report_pb2.Estimator, ModuleMode, ComputeDtype, MemoryFormat) in lowercase."""
    check_names(options, ENGINE_OPTIONS, "engine option")
    out = recal_pb2.EngineOptions()
    values = {k: v for k, v in options.items() if v is not None}
    if "estimator" in values:
        out.estimator = _enum(report_pb2.Estimator, values.pop("estimator"), _ESTIMATORS, "estimator")
    if "modules" in values:
        out.modules = _enum(report_pb2.ModuleMode, values.pop("modules"), _MODULES, "modules")
    if "compute_dtype" in values:
        out.compute_dtype = _enum_name(report_pb2.ComputeDtype, values.pop("compute_dtype"),
                                       _COMPUTE_DTYPES, "compute_dtype")
    if "memory_format" in values:
        out.memory_format = _enum_name(report_pb2.MemoryFormat, values.pop("memory_format"),
                                       _MEMORY_FORMATS, "memory_format")
    for key, value in values.items():
        setattr(out, key, value)
    return out


_STATES = {name.lower(): number for name, number in recal_pb2.JobState.items() if number}


def job_state(value):
    """JobState number for "queued" / "QUEUED" / recal.QUEUED."""
    return _enum(recal_pb2.JobState, value, _STATES, "job state")


_ARTIFACTS = {"model": recal_pb2.MODEL, "bn": recal_pb2.BN_BUFFERS,
              "bn_buffers": recal_pb2.BN_BUFFERS, "report": recal_pb2.REPORT, "folded": recal_pb2.FOLDED}


def artifact(value):
    """Artifact number for "model" | "bn" | "report" (or the enum)."""
    return _enum(recal_pb2.Artifact, value, _ARTIFACTS, "artifact")
