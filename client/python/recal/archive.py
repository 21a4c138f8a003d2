"""What kind of model archive a file is, told from its zip directory before any byte is sent.

The server decides from the archive's records (server/engine/model_file.cc,
DetectModelFormat), and so does this, with the same rules and words, without torch:
    not a zip (no "PK\\x03\\x04" at the start)   refused: a pickle, an ONNX file, a truncated copy
    an `archive_format` record                   a torch.export program (PT2)
    `constants.pkl` or `code/__torch__.py`       TorchScript
    `data.pkl` only                              refused: torch.save's state_dict or pickled module
    none of them                                 refused: a zip, but not a model archive
A record is named under the archive's top folder (the first entry's), as PyTorch's reader
reads it. A zip this reader cannot read is left to the server to judge: only what the
server would surely refuse is refused here. The C++ client has the same rules
(common/model_archive.h).
"""

import zipfile

import grpc

from recal.errors import RecalError

EXPORTED_PROGRAM = "exported_program"
TORCHSCRIPT = "torchscript"

ACCEPTED = ("Recal reads TorchScript (torch.jit.save(torch.jit.script(model), 'model.pt')) and "
            "torch.export programs (torch.export.save(torch.export.export(model, example_inputs), "
            "'model.pt2'))")
_STATE_DICT_FIX = ("load it into its module and export that (or give the module to recal.torch.recalibrate, "
                   "which exports it)")


def _records(zf):
    """The archive's record names under its top folder, as PyTorch's reader names them."""
    names = zf.namelist()
    if not names:
        return set()
    top = names[0].split("/", 1)[0] + "/"
    return {name[len(top):] for name in names if name.startswith(top)}


def model_format(path):
    """EXPORTED_PROGRAM, TORCHSCRIPT, or None when the zip cannot be read here (the server
    judges it). Raises RecalError(INVALID_ARGUMENT) naming `path` for a file the server
    would refuse; OSError when it cannot be read."""
    with open(path, "rb") as f:
        magic = f.read(4)
        if magic != b"PK\x03\x04":
            raise _refused(path, "not a model archive (not a zip file: a truncated copy, a pickle, an ONNX file?)")
        try:
            records = _records(zipfile.ZipFile(f))
        except (zipfile.BadZipFile, ValueError, EOFError):
            return None
    if "archive_format" in records:
        return EXPORTED_PROGRAM
    if "constants.pkl" in records or "code/__torch__.py" in records:
        return TORCHSCRIPT
    if "data.pkl" in records:
        raise _refused(path, "a torch.save file (a state_dict or a pickled module), not a model program: "
                       + _STATE_DICT_FIX)
    raise _refused(path, "a zip file but not a model archive")


def _refused(path, why):
    return RecalError(grpc.StatusCode.INVALID_ARGUMENT, "%s: %s. %s; nothing was sent" % (path, why, ACCEPTED))
