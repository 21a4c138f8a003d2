"""Python client for recal-server (BatchNorm recalibration as a service).

    import recal

    client = recal.Client("localhost:50051")
    job = client.recalibrate("resnet18.pt", data="npy:data/resnet18.npy", out="out.pt")

recal.Client wraps the recal.v1.Recal gRPC service (proto/recal/v1/recal.proto): uploads
that skip known models and resume, idempotent submits, watches that resume across server
restarts, verified resumable downloads. Failures raise recal.RecalError (.code is the
grpc.StatusCode, .message the server's message). The messages are in recal.recal_pb2 and
recal.report_pb2; the JobState values are also here (recal.SUCCEEDED, ...). recal.to_dict
and recal.to_json turn a message (a RunReport, a Job) into plain values: ints as ints (not
protobuf JSON's strings), enums by name.

recal.torch (imported on first use; needs torch) recalibrates an nn.Module in place from a
DataLoader: recal.torch.recalibrate(model, loader, server="host:port", token=...).

The gRPC stubs (recal/_proto/) are generated when the package is built (setup.py) or the
project is (CMake). recal.read_safetensors reads the BatchNorm buffers artifact with no extra
package.
"""

try:
    from recal._proto.recal.v1 import recal_pb2, recal_pb2_grpc, report_pb2
except ModuleNotFoundError as _error:  # pragma: no cover
    if not (_error.name or "").startswith("recal._proto"):
        raise
    raise ImportError("recal: the generated gRPC stubs (client/python/recal/_proto) are missing; "
                      "install the package (pip install ./client/python generates them), or build "
                      "the project first (cmake --build build, or just its target recal_python)") from _error

from recal.client import TERMINAL_STATES, Client
from recal.errors import RecalError
from recal.messages import read_report, to_dict, to_json
from recal.safetensors_reader import read_safetensors
from recal.specs import data_source, engine_options
from recal.streams import PushStream, tensor_message

JobState = recal_pb2.JobState
QUEUED = recal_pb2.QUEUED
RUNNING = recal_pb2.RUNNING
CANCELLING = recal_pb2.CANCELLING
SUCCEEDED = recal_pb2.SUCCEEDED
FAILED = recal_pb2.FAILED
CANCELLED = recal_pb2.CANCELLED

__all__ = ["Client", "RecalError", "JobState", "QUEUED", "RUNNING", "CANCELLING", "SUCCEEDED",
           "FAILED", "CANCELLED", "TERMINAL_STATES", "data_source", "engine_options", "recal_pb2",
           "recal_pb2_grpc", "report_pb2", "PushStream", "tensor_message", "to_dict", "to_json",
           "read_report", "read_safetensors"]


def __getattr__(name):
    # recal.torch (the SDK for training code) needs torch: imported on first use only, so
    # that `import recal` works, and stays light, without torch.
    if name == "torch":
        import importlib

        return importlib.import_module("recal.torch")
    raise AttributeError("module 'recal' has no attribute %r" % name)
