"""Client streams: batches a client pushes to a client_stream job (PushBatches), and the
job's events relayed to the thread that pushes.

Nothing here imports numpy or torch: arrays are taken by duck typing (.dtype, .shape,
.tobytes()), as numpy arrays have them; recal.torch turns torch tensors into such arrays.
"""

import queue
import sys
import threading

import grpc

from recal._proto.recal.v1 import recal_pb2
from recal.errors import RecalError

# The dtypes the API carries (recal.v1.Tensor.DType), by numpy dtype name. The server turns
# each into float32 before the forward (after scale / mean / std when the job has them), so
# uint8 images and float16 travel at 1 and 2 bytes per value.
WIRE_DTYPES = {"float32": recal_pb2.Tensor.FLOAT32, "float16": recal_pb2.Tensor.FLOAT16,
               "uint8": recal_pb2.Tensor.UINT8}

_POLL_SECONDS = 0.05
# Room for a message's own fields (job id, dtype, shape) beside the tensor bytes.
_MESSAGE_OVERHEAD = 64 << 10
# A server that predates GetServerInfo takes gRPC's default message size.
_DEFAULT_MESSAGE_LIMIT = 4 << 20


def tensor_message(value):
    """A recal_pb2.Tensor for one input of one batch: a Tensor message (as is), or an array
    (numpy's, or anything with .dtype, .shape and .tobytes()) of float32, float16 or uint8
    with the batch as dim 0. Raises TypeError for another dtype, ValueError for a 0-d or
    empty array."""
    if isinstance(value, recal_pb2.Tensor):
        return value
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is None or shape is None or not hasattr(value, "tobytes"):
        raise TypeError("a pushed input must be a recal_pb2.Tensor or an array (numpy), not %s"
                        % type(value).__name__)
    name = getattr(dtype, "name", str(dtype))
    if name not in WIRE_DTYPES:
        raise TypeError("a pushed input must be float32, float16 or uint8 (the server's Tensor "
                        "dtypes), not %s" % name)
    shape = [int(d) for d in shape]
    if not shape or min(shape) < 1:
        raise ValueError("a pushed input needs a batch dimension and no empty dimension; shape %s"
                         % (shape,))
    order = getattr(dtype, "byteorder", "=")
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        value = value.astype(dtype.newbyteorder("<"))  # the wire is little-endian
    return recal_pb2.Tensor(dtype=WIRE_DTYPES[name], shape=shape, data=value.tobytes())


def batch_inputs(batch):
    """The Tensor messages of one batch: one input (a Tensor message or an array) or a
    list/tuple of them (the forward's positional inputs, in order)."""
    if isinstance(batch, (list, tuple)):
        if not batch:
            raise ValueError("a batch needs at least one input")
        return [tensor_message(x) for x in batch]
    return [tensor_message(batch)]


def batch_messages(inputs, part_bytes):
    """The PushBatchesRequest messages that carry one batch (a list of Tensor messages): one
    when it fits `part_bytes`, else a first part with every input's dtype and shape and then
    the data, input after input, `part_bytes` at a time (PushBatchesRequest.batch_continues);
    the server joins the parts into the same batch."""
    if sum(len(t.data) for t in inputs) <= part_bytes:
        return [recal_pb2.PushBatchesRequest(inputs=inputs)]
    parts = [recal_pb2.PushBatchesRequest(
        inputs=[recal_pb2.Tensor(dtype=t.dtype, shape=t.shape) for t in inputs])]
    pieces = [[] for _ in inputs]  # the current part's data per input
    room = part_bytes
    for i, tensor in enumerate(inputs):
        data = memoryview(tensor.data)
        at = 0
        while at < len(data):
            if room == 0:
                for k, piece in enumerate(pieces):
                    parts[-1].inputs[k].data += b"".join(piece)
                parts[-1].batch_continues = True
                parts.append(recal_pb2.PushBatchesRequest(inputs=[recal_pb2.Tensor() for _ in inputs]))
                pieces = [[] for _ in inputs]
                room = part_bytes
            n = min(room, len(data) - at)
            pieces[i].append(data[at:at + n])
            at += n
            room -= n
    for k, piece in enumerate(pieces):
        parts[-1].inputs[k].data += b"".join(piece)
    return parts


def part_bytes(stub, metadata=None):
    """The tensor bytes one PushBatches message may carry to the server behind `stub`."""
    try:
        info = stub.GetServerInfo(recal_pb2.GetServerInfoRequest(), metadata=metadata, timeout=30)
        limit = info.max_message_bytes or _DEFAULT_MESSAGE_LIMIT
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise RecalError.from_rpc_error(error, "asking the server for its limits") from error
        limit = _DEFAULT_MESSAGE_LIMIT
    return max(limit - _MESSAGE_OVERHEAD, 4096)


def _push_error(error, job_id):
    """RecalError for a failed PushBatches call, with what to do about a batch too large."""
    result = RecalError.from_rpc_error(error, "pushing batches to job %s" % job_id)
    if result.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        result = RecalError(result.code, result.message + " (a batch, all its inputs together, must "
                            "fit the server's --max_batch_bytes, 256 MiB by default: push smaller "
                            "batches, uint8 or float16 inputs, or raise that limit)")
    return result


class PushStream:
    """One PushBatches call that feeds a client_stream job from the calling thread.

    send(inputs) queues one batch and returns once gRPC has taken the one before it, so the
    caller produces a batch only when the connection (and behind it the server's bounded
    queue of 4 batches, which it fills no faster than the job runs) takes them:
    back-pressure reaches the caller's data loader. While send() waits it calls `on_wait()`
    every 50 ms (e.g. to deliver progress in the caller's thread). close() ends the data
    and returns the batches the server received; abort() cancels the call (the job keeps
    waiting for data: cancel it too). Errors raise RecalError.
    """

    def __init__(self, stub, job_id, metadata=None, on_wait=None, shard=0):
        self.job_id = job_id
        self.shard = shard
        self.sent = 0
        self._on_wait = on_wait
        self._queue = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._ended = False
        self._part_bytes = part_bytes(stub, metadata)
        self._call = stub.PushBatches.future(self._requests(), metadata=metadata)

    def _requests(self):
        # gRPC consumes this on its own thread, asking for the next message only once the
        # previous one is written.
        yield recal_pb2.PushBatchesRequest(job_id=self.job_id, shard=self.shard)  # names the job: fails fast
        while not self._stop.is_set():
            try:
                message = self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            yield message
            if message.last:
                return

    def _put(self, message):
        while True:
            if self._call.done():
                self._raise()
            try:
                self._queue.put(message, timeout=_POLL_SECONDS)
                return
            except queue.Full:
                if self._on_wait is not None:
                    self._on_wait()

    def _raise(self):
        try:
            self._call.result()
        except grpc.RpcError as error:
            raise _push_error(error, self.job_id) from error
        raise RecalError(grpc.StatusCode.FAILED_PRECONDITION,
                         "job %s took no more batches after %d" % (self.job_id, self.sent))

    def send(self, batch, last=False):
        """Queues one batch (see batch_inputs); `last`: no batch follows."""
        if self._ended:
            raise ValueError("the data of job %s has ended" % self.job_id)
        messages = batch_messages(batch_inputs(batch), self._part_bytes)
        messages[-1].last = last
        for message in messages:
            self._put(message)
        self.sent += 1
        self._ended = last

    def close(self):
        """Ends the data (unless a batch was marked last) and waits for the server's answer:
        the number of batches it received."""
        if not self._ended:
            self._put(recal_pb2.PushBatchesRequest(last=True))
            self._ended = True
        while True:
            try:
                return self._call.result(timeout=_POLL_SECONDS).batches_received
            except grpc.FutureTimeoutError:
                if self._on_wait is not None:
                    self._on_wait()
            except grpc.RpcError as error:
                raise _push_error(error, self.job_id) from error

    def abort(self):
        self._stop.set()
        self._call.cancel()


def deliver_event(event, on_progress=None, on_queued=None):
    """A watched JobEvent to its callback: on_progress(JobProgress) for progress,
    on_queued(JobWait) for a snapshot of the job while it is QUEUED (why it waits)."""
    kind = event.WhichOneof("kind")
    if on_progress is not None and kind == "progress":
        on_progress(event.progress)
    if on_queued is not None and kind == "snapshot" and event.snapshot.HasField("wait"):
        on_queued(event.snapshot.wait)


class EventRelay:
    """Watches a job on a background thread; deliver() and wait() hand its progress events
    to on_progress, and the JobWait of a snapshot that finds it QUEUED to on_queued, in the
    caller's thread."""

    def __init__(self, client, job_id, on_progress=None, on_queued=None):
        self.job_id = job_id
        self._client = client
        self._on_progress = on_progress
        self._on_queued = on_queued
        self._events = queue.Queue()
        self._thread = threading.Thread(target=self._watch, name="recal-watch-" + job_id, daemon=True)
        self._thread.start()

    def _watch(self):
        try:
            for event in self._client.watch(self.job_id):
                self._events.put(event)
        except BaseException as error:  # handed to the caller's thread
            self._events.put(error)
        self._events.put(None)

    def _handle(self, item):
        """False once the watch has ended."""
        if item is None:
            return False
        if isinstance(item, BaseException):
            raise item
        deliver_event(item, self._on_progress, self._on_queued)
        return True

    def deliver(self):
        """Hands over the events that have arrived, without waiting."""
        while True:
            try:
                item = self._events.get_nowait()
            except queue.Empty:
                return
            if not self._handle(item):
                self._events.put(None)  # keep the end for wait()
                return

    def wait(self):
        """Hands over every event until the job has ended; returns the final Job."""
        while self._handle(self._events.get()):
            pass
        self._thread.join()
        return self._client.get(self.job_id)
