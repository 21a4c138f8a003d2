"""recal.Client: the recal.v1.Recal service from Python, with the retries and resumes a
user would otherwise write by hand (see the package docstring for an example)."""

import collections
import hashlib
import itertools
import os
import time
import uuid

import grpc

from recal import archive, messages, specs, streams
from recal._proto.grpc.health.v1 import health_pb2, health_pb2_grpc
from recal._proto.recal.v1 import recal_pb2, recal_pb2_grpc
from recal.errors import RecalError

CHUNK_BYTES = 1 << 20
# Where recalctl looks too (client/recalctl/main.cc): --server / RECAL_SERVER, --token / RECAL_TOKEN.
DEFAULT_SERVER = "localhost:50051"
SERVER_ENV = "RECAL_SERVER"
TOKEN_ENV = "RECAL_TOKEN"
TERMINAL_STATES = frozenset((recal_pb2.SUCCEEDED, recal_pb2.FAILED, recal_pb2.CANCELLED))

# Reconnect soon after the server comes back (gRPC's default backoff grows to 120 s).
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def server_address(target=None):
    """`target`, else $RECAL_SERVER, else localhost:50051 (recalctl's order)."""
    return target or os.environ.get(SERVER_ENV) or DEFAULT_SERVER


def server_token(token=None):
    """`token`, else $RECAL_TOKEN (recalctl's order); "" means none."""
    if token is None:
        token = os.environ.get(TOKEN_ENV)
    return token or None


def _where_from(target):
    """How the address was chosen, for the unreachable-server message."""
    if target:
        return "given"
    if os.environ.get(SERVER_ENV):
        return "from $%s" % SERVER_ENV
    return "the default; $%s is not set" % SERVER_ENV


def _unreachable_message(address, where, seconds, tls):
    """What a user sees when nothing answers: where we looked and what to do about it."""
    message = ("no recal-server answered at %s (%s) within %g s. Is recal-server running there? "
               "Start one with `recal-server --listen=%s` (build/bin/recal-server after a build), "
               "or point the client at yours: recal.Client(\"host:port\"), "
               "recal.torch.recalibrate(..., server=\"host:port\"), or %s=host:port"
               % (address, where, seconds, address, SERVER_ENV))
    if tls:
        message += ("; over TLS a refused handshake looks the same: check tls_ca, tls_cert, tls_key "
                    "and tls_server_name")
    return message


def _id(value):
    """An id string from a string or a message that has an id (Model, Job)."""
    return value if isinstance(value, str) else value.id


def _transient(error):
    """A call that may succeed if made again: the server is unreachable or restarting, or
    the connection broke in the middle of a stream."""
    code = error.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return True
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        details = (error.details() or "").lower()
        return any(s in details for s in ("rst_stream", "stream removed", "socket closed",
                                          "connection reset", "broken pipe"))
    return False


class _Backoff:
    """Sleeps 0.1 s, 0.2 s, ... up to 2 s between tries, for at most `budget` seconds in all
    (reset() when the other side answered)."""

    def __init__(self, budget):
        self.budget = budget
        self.reset()

    def reset(self):
        self.delay = 0.1
        self.deadline = time.monotonic() + self.budget

    def wait(self):
        """False when the budget is spent; else sleeps and returns True."""
        now = time.monotonic()
        if now >= self.deadline:
            return False
        time.sleep(min(self.delay, self.deadline - now))
        self.delay = min(self.delay * 2, 2.0)
        return True


def _file_digest(path):
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(CHUNK_BYTES)
            if not block:
                break
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def _read_pem(path, what):
    with open(path, "rb") as f:
        pem = f.read()
    # gRPC would only fail the handshake, as UNAVAILABLE at every call, with no word of why.
    if b"-----BEGIN " not in pem:
        raise ValueError("%s %r holds no PEM data" % (what, path))
    return pem


def _make_channel(target, tls, tls_ca, tls_cert, tls_key, tls_server_name):
    """A plaintext channel, or a TLS one when anything TLS-specific is given (a plaintext
    channel would silently drop it)."""
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_cert needs tls_key" if tls_cert else "tls_key needs tls_cert")
    if not (tls or tls_ca or tls_cert or tls_server_name):
        return grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read_pem(tls_ca, "TLS root certificates") if tls_ca else None,
        private_key=_read_pem(tls_key, "TLS client key") if tls_key else None,
        certificate_chain=_read_pem(tls_cert, "TLS client certificate") if tls_cert else None)
    options = _CHANNEL_OPTIONS
    if tls_server_name:
        options += (("grpc.ssl_target_name_override", tls_server_name),)
    return grpc.secure_channel(target, credentials, options=options)


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds "authorization: Bearer TOKEN" to every call of the channel, so that calls made
    through Client.stub directly carry it too."""

    def __init__(self, token):
        self._header = ("authorization", "Bearer " + token)

    def _with_token(self, details):
        return _CallDetails(details.method, details.timeout, tuple(details.metadata or ()) + (self._header,),
                            details.credentials, getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
        grpc.ClientCallDetails):
    pass


def _write_atomically(path, text):
    """PATH.tmp, fsynced, renamed to PATH: a reader sees the old file or the whole new one."""
    temporary = os.fspath(path) + ".tmp"
    with open(temporary, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    _fsync_dir(path)


def _fsync_dir(path):
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Client:
    """A connection to recal-server.

    target: "host:port" (or any gRPC target); None: $RECAL_SERVER, else localhost:50051.
    token: sent as "authorization: Bearer TOKEN" metadata on every call; None: $RECAL_TOKEN
    ("" for none). timeout: seconds each unary call may take (None: no limit; streams are
    never limited). connect_seconds: how long the first call waits for the server to answer
    at all before raising RecalError(UNAVAILABLE) that says what to do (None or 0: no such
    check). retry_seconds: how long unary calls are retried while the server is UNAVAILABLE
    after it has answered once; reconnect_seconds: how long watch / download / upload keep
    reconnecting after the connection broke (from the last answer). A Client may be used
    from several threads; close() it (or use `with`) when done.

    TLS: tls=True for TLS with gRPC's default roots; tls_ca: a PEM file of the roots the
    server's certificate must chain to; tls_cert and tls_key: PEM files of the client's
    certificate and its key, for servers that ask for one (mutual TLS; both or neither);
    tls_server_name: the name the server's certificate must carry when it is not the host
    of `target` (e.g. a server reached by IP address). Each of these implies TLS. A file
    that cannot be read raises OSError, one without PEM data ValueError.
    """

    def __init__(self, target=None, token=None, timeout=None, *, connect_seconds=5.0,
                 retry_seconds=30.0, reconnect_seconds=60.0, channel=None, tls=False, tls_ca=None,
                 tls_cert=None, tls_key=None, tls_server_name=None):
        if channel is not None and (tls or tls_ca or tls_cert or tls_key or tls_server_name):
            raise ValueError("give a channel or TLS settings, not both")
        self.target = server_address(target)
        self._target_from = _where_from(target)
        self._tls = bool(tls or tls_ca or tls_cert or tls_server_name)
        token = server_token(token)
        self.timeout = timeout
        self.connect_seconds = connect_seconds
        self._answered = False  # set once the channel was ready: from then on, retries only
        self.retry_seconds = retry_seconds
        self.reconnect_seconds = reconnect_seconds
        self._metadata = None  # the token travels with the channel (_BearerToken)
        self._channel = channel or _make_channel(self.target, tls, tls_ca, tls_cert, tls_key,
                                                 tls_server_name)
        calls = grpc.intercept_channel(self._channel, _BearerToken(token)) if token else self._channel
        self.stub = recal_pb2_grpc.RecalStub(calls)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------------ plumbing

    def _check_reachable(self):
        """Before the first call: wait at most connect_seconds for the channel to connect, so
        that a wrong address or a server that is not running fails in seconds, saying what
        to do, instead of after retry_seconds of silent retries. A server that answered once
        and went away is retried as before (it is likely restarting)."""
        if self._answered or not self.connect_seconds:
            return
        ready = grpc.channel_ready_future(self._channel)
        try:
            ready.result(timeout=self.connect_seconds)
        except grpc.FutureTimeoutError:
            raise RecalError(grpc.StatusCode.UNAVAILABLE, _unreachable_message(
                self.target, self._target_from, self.connect_seconds, self._tls)) from None
        finally:
            ready.cancel()
        self._answered = True

    def _unary(self, method, request, retry=True):
        """Calls a unary RPC, retrying UNAVAILABLE with backoff (all our unary calls are
        idempotent: SubmitJob through its request_id); errors become RecalError."""
        self._check_reachable()
        backoff = _Backoff(self.retry_seconds)
        while True:
            try:
                return method(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as error:
                if retry and error.code() == grpc.StatusCode.UNAVAILABLE and backoff.wait():
                    continue
                raise RecalError.from_rpc_error(error) from error

    def health(self, service=""):
        """The server's health: "SERVING", or "NOT_SERVING" once it is shutting down."""
        response = self._unary(self._health.Check, health_pb2.HealthCheckRequest(service=service),
                               retry=False)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def _all_pages(self, method, request, field):
        """Every item of a paged List call, following next_page_token."""
        items = []
        while True:
            page = self._unary(method, request)
            items.extend(getattr(page, field))
            if not page.next_page_token:
                return items
            request.page_token = page.next_page_token

    # -------------------------------------------------------------------------- models

    # A model is named by a reference wherever one is taken: "sha256:<hex>", a unique digest
    # prefix (6+ hex digits), "name" (its latest version) or "name:version" (docs/models.md).

    def get_model(self, model):
        return self._unary(self.stub.GetModel, recal_pb2.GetModelRequest(id=_id(model)))

    def list_models(self, name=None):
        """The tenant's models (with `name`: that name's versions), newest first."""
        return self._all_pages(self.stub.ListModels, recal_pb2.ListModelsRequest(name=name or ""), "models")

    def delete_model(self, model):
        """Deletes a model (refused while a queued or running job uses it); returns it."""
        return self._unary(self.stub.DeleteModel, recal_pb2.DeleteModelRequest(id=_id(model)), retry=False).model

    def upload_model(self, path, name=None, labels=None):
        """Uploads a model archive (TorchScript or a torch.export PT2) and returns its Model (id "sha256:<hex>").

        Nothing is sent when the server already has these bytes; an upload broken off
        earlier (by anyone) continues from the server's committed size; a connection lost
        midway is resumed the same way. A file the server would refuse for its format (a
        torch.save'd state_dict, a pickle, an ONNX file) is refused here, before any byte is
        sent: RecalError(INVALID_ARGUMENT) naming it (recal.archive)."""
        archive.model_format(path)
        size, digest = _file_digest(path)
        model_id = "sha256:" + digest
        try:
            return self.get_model(model_id)
        except RecalError as error:
            if error.code != grpc.StatusCode.NOT_FOUND:
                raise
        header = recal_pb2.UploadHeader(name=name or os.path.basename(path), size=size,
                                        sha256=digest, labels=labels or {})
        backoff = _Backoff(self.reconnect_seconds)
        conflicts = 0
        while True:
            status = self._unary(self.stub.GetUploadStatus,
                                 recal_pb2.GetUploadStatusRequest(sha256=digest))
            if status.model_id:
                return self.get_model(status.model_id)
            try:
                return self.stub.UploadModel(self._upload_requests(path, header, status.committed_size),
                                             metadata=self._metadata)
            except grpc.RpcError as error:
                # FAILED_PRECONDITION: someone else appended meanwhile; ask again where to go on.
                if error.code() == grpc.StatusCode.FAILED_PRECONDITION and conflicts < 3:
                    conflicts += 1
                    continue
                if _transient(error) and backoff.wait():
                    continue
                raise RecalError.from_rpc_error(error, "upload of %s" % path) from error

    @staticmethod
    def _upload_requests(path, header, offset):
        yield recal_pb2.UploadModelRequest(header=header)
        with open(path, "rb") as f:
            f.seek(offset)
            while offset < header.size:
                data = f.read(min(CHUNK_BYTES, header.size - offset))
                if not data:
                    raise RecalError(grpc.StatusCode.DATA_LOSS, "%s shrank while uploading" % path)
                yield recal_pb2.UploadModelRequest(chunk=recal_pb2.UploadChunk(offset=offset, data=data))
                offset += len(data)

    # ---------------------------------------------------------------------------- jobs

    def submit(self, model_id, data, batch_size=32, request_id=None, priority=0, timeout_seconds=0,
               labels=None, shards=1, **engine_options):
        """Submits a job and returns it (QUEUED).

        model_id: "sha256:<hex>" or a Model. data: a spec string ("npy:PATH",
        "safetensors:PATH[:K1,K2]", "torch:PATH", "synthetic:3x224x224[,seed=S]"; paths are
        on the server, under its --data_root) or a DataSource message. engine_options:
        estimator, modules, include, exclude, max_batches, allow_short_data,
        target_rel_error. request_id (default: a fresh uuid4) makes retries safe: the server
        returns the job it already made for it. shards > 1: the job runs as that many shards
        on any workers, merged exactly (a client_stream job then takes one push per shard)."""
        spec = recal_pb2.JobSpec(model_id=_id(model_id), data=specs.data_source(data),
                                 batch_size=batch_size, options=specs.engine_options(**engine_options),
                                 priority=priority, timeout_seconds=timeout_seconds,
                                 labels=labels or {}, shards=shards if shards > 1 else 0)
        request = recal_pb2.SubmitJobRequest(spec=spec, request_id=request_id or uuid.uuid4().hex)
        return self._unary(self.stub.SubmitJob, request)

    def get(self, job_id):
        return self._unary(self.stub.GetJob, recal_pb2.GetJobRequest(id=_id(job_id)))

    def list(self, states=None):
        """Every job (newest first, as the server lists them), or those in `states`
        ("queued", recal.RUNNING, ... or one of them)."""
        if states is None:
            states = []
        elif isinstance(states, (str, int)):
            states = [states]
        request = recal_pb2.ListJobsRequest(states=[specs.job_state(s) for s in states])
        return self._all_pages(self.stub.ListJobs, request, "jobs")

    def cancel(self, job_id):
        """Cancels a job: a queued one is CANCELLED at once, a running one CANCELLING until
        its next batch. Returns the job as the server has it now."""
        return self._unary(self.stub.CancelJob, recal_pb2.CancelJobRequest(id=_id(job_id)))

    def delete_job(self, job_id):
        """Deletes an ended job with its results (refused, FAILED_PRECONDITION, while it is queued
        or running: cancel it first). Returns the DeleteJobResponse: the job as it was and the
        bytes its results held. Not retried: a retry after a lost reply would say NOT_FOUND."""
        return self._unary(self.stub.DeleteJob, recal_pb2.DeleteJobRequest(id=_id(job_id)), retry=False)

    def usage(self):
        """What the tenant stores (models, results, unfinished uploads; counts and bytes) and its
        max_stored_bytes quota (0: none): a Usage message."""
        return self._unary(self.stub.GetUsage, recal_pb2.GetUsageRequest())

    def watch(self, job_id, after_seq=0):
        """Yields the job's JobEvents: a snapshot (the job as it is now), then every event
        after `after_seq`, ending after the terminal state (SUCCEEDED, FAILED, CANCELLED).

        If the connection breaks or the server restarts, it reconnects with the last seq it
        yielded and goes on: no event is lost or repeated, and only the first snapshot is
        yielded. It gives up with RecalError(UNAVAILABLE) after `reconnect_seconds` without
        an answer."""
        self._check_reachable()
        job_id = _id(job_id)
        last = after_seq
        snapshot_sent = False
        backoff = _Backoff(self.reconnect_seconds)
        while True:
            call = self.stub.WatchJob(recal_pb2.WatchJobRequest(id=job_id, after_seq=last),
                                      metadata=self._metadata)
            try:
                for event in call:
                    backoff.reset()
                    if event.HasField("snapshot"):
                        if snapshot_sent:
                            continue
                        snapshot_sent = True
                    elif event.seq <= last:
                        continue  # already yielded
                    else:
                        last = event.seq
                    yield event
                    if event.WhichOneof("kind") == "state" and event.state in TERMINAL_STATES:
                        return
                return  # the server ended the stream: nothing more will come
            except grpc.RpcError as error:
                if _transient(error) and backoff.wait():
                    continue
                raise RecalError.from_rpc_error(
                    error, "watching job %s (last seq %d)" % (job_id, last)) from error
            finally:
                call.cancel()

    def wait(self, job_id, on_progress=None, on_queued=None):
        """Follows the job until it ends and returns the final Job (whatever its state).
        on_progress(JobProgress) is called for every progress event; on_queued(JobWait),
        when the watch finds the job QUEUED, with why it waits (Job.wait)."""
        for event in self.watch(job_id):
            streams.deliver_event(event, on_progress, on_queued)
        return self.get(job_id)

    # ------------------------------------------------------------------------- results

    def download(self, job_id, path, artifact="model"):
        """Downloads an artifact of a SUCCEEDED job: "model" (the recalibrated model, in
        the format it was uploaded in: TorchScript or a torch.export PT2 archive), "bn" (the BatchNorm buffers, safetensors), "report" (JSON) or "folded" (the folded model
        of a job submitted with fold_batch_norm=True, a PT2 archive).

        Writes PATH.part, resumes from its size after a broken stream (and in a later call
        after a broken-off one), checks the size and sha256 the server gives, fsyncs and
        renames it to PATH. Returns the artifact's sha256 (hex)."""
        self._check_reachable()
        job_id = _id(job_id)
        kind = specs.artifact(artifact)
        path = os.fspath(path)
        part = path + ".part"
        for attempt in range(2):
            digest = hashlib.sha256()
            offset = 0
            if attempt == 0 and os.path.exists(part):
                with open(part, "rb") as f:  # a download broken off before
                    while True:
                        block = f.read(CHUNK_BYTES)
                        if not block:
                            break
                        digest.update(block)
                        offset += len(block)
            resumed = offset > 0
            expected, total = None, None
            with open(part, "r+b" if resumed else "wb") as f:
                f.seek(offset)
                backoff = _Backoff(self.reconnect_seconds)
                while True:
                    call = self.stub.DownloadResult(
                        recal_pb2.DownloadResultRequest(job_id=job_id, artifact=kind, offset=offset),
                        metadata=self._metadata)
                    try:
                        for chunk in call:
                            backoff.reset()
                            if chunk.offset != offset:
                                raise RecalError(grpc.StatusCode.DATA_LOSS, "download of job %s: chunk at "
                                                 "offset %d, expected %d" % (job_id, chunk.offset, offset))
                            if chunk.sha256:
                                if expected is not None and chunk.sha256 != expected:
                                    raise RecalError(grpc.StatusCode.DATA_LOSS, "download of job %s: the "
                                                     "artifact changed while downloading" % job_id)
                                expected = chunk.sha256
                            total = chunk.total_size
                            f.write(chunk.data)
                            digest.update(chunk.data)
                            offset += len(chunk.data)
                        break
                    except grpc.RpcError as error:
                        if resumed and error.code() == grpc.StatusCode.OUT_OF_RANGE:
                            break  # the partial file is longer than the artifact: start over
                        if _transient(error) and backoff.wait():
                            continue
                        raise RecalError.from_rpc_error(
                            error, "download of job %s %s" % (job_id, recal_pb2.Artifact.Name(kind))) from error
                    finally:
                        call.cancel()
                f.flush()
                os.fsync(f.fileno())
            if total is not None and offset == total and digest.hexdigest() == expected:
                os.replace(part, path)
                _fsync_dir(path)
                return expected
            os.remove(part)
            if not resumed:
                raise RecalError(grpc.StatusCode.DATA_LOSS, "download of job %s %s: got %d bytes with "
                                 "sha256 %s, the server announced %s bytes with sha256 %s"
                                 % (job_id, recal_pb2.Artifact.Name(kind), offset, digest.hexdigest(),
                                    total, expected))
            # A stale or foreign PATH.part: download the whole artifact again.

    # -------------------------------------------------------------------- client streams

    def open_push(self, job_id, on_wait=None, shard=0):
        """A PushStream feeding the client_stream job `job_id` (its shard `shard`, for a
        sharded job) from this thread: send(batch) per batch (blocks while the server's queue
        is full), then close(). See recal.streams.PushStream."""
        self._check_reachable()
        return streams.PushStream(self.stub, _id(job_id), self._metadata, on_wait, shard=shard)

    def push(self, job_id, batches, shard=0):
        """Pushes every batch of `batches` to a client_stream job and ends its data; returns
        the number of batches the server received. A batch is one input or a list/tuple of
        the forward's positional inputs, each a numpy array of float32, float16 or uint8 (or
        a recal_pb2.Tensor), dim 0 the batch. Not resumable: a broken call raises
        RecalError, and the job needs a new one (cancel it). A sharded job takes one push per
        shard (`shard` in 0..shards-1), from any process: each rank pushes its own."""
        stream = self.open_push(job_id, shard=shard)
        try:
            for batch in batches:
                stream.send(batch)
            return stream.close()
        except BaseException:
            stream.abort()
            raise

    def recalibrate_stream(self, model_path, batches, out=None, batch_size=None, max_batches=None,
                           bn_out=None, report=None, on_progress=None, scale=None, mean=None,
                           std=None, on_queued=None, **options):
        """recalibrate() on batches pushed from here: uploads `model_path` (unless the server
        has it; or give a Model), submits a client_stream job, pushes `batches` (as in
        push(), at most `max_batches` of them, read in this thread only as fast as the job
        takes them), waits and downloads as recalibrate() does (the report's `batches` says
        how many the job used).

        scale, mean, std: the server turns every input into float32 (x / scale - mean) / std
        per channel (dim 1) before the forward (none given: converted only). batch_size is
        what the report says (default: the first batch's size). on_progress(JobProgress)
        is called in this thread, and so is on_queued(JobWait) as in wait(). The job may end before the data does (max_batches
        reached, target_rel_error met): pushing stops there. Returns the final Job; raises
        RecalError if the job FAILED or was CANCELLED (or a push failed: then the job is
        cancelled), ValueError for no batches. Any other exception while pushing (from the
        caller's data) cancels the job and propagates."""
        iterator = iter(batches)
        if max_batches is not None:
            iterator = itertools.islice(iterator, max_batches)
        first = next(iterator, None)
        if first is None:
            raise ValueError("no batches to push")
        inputs = streams.batch_inputs(first)
        if batch_size is None:
            batch_size = max(1, inputs[0].shape[0])
        model = model_path if isinstance(model_path, recal_pb2.Model) else self.upload_model(model_path)
        source = recal_pb2.ClientStreamSource(scale=scale or 0, mean=mean or [], std=std or [])
        job = self.submit(model, source, batch_size=batch_size, max_batches=max_batches, **options)
        relay = streams.EventRelay(self, job.id, on_progress, on_queued)
        stream = self.open_push(job, on_wait=relay.deliver)
        pushed = 0
        try:
            try:
                for batch in itertools.chain([inputs], iterator):
                    pushed += 1
                    stream.send(batch, last=pushed == max_batches)
                    relay.deliver()
                stream.close()
            except RecalError as error:
                # FAILED_PRECONDITION / CANCELLED: the job took what it needed (max_batches,
                # target_rel_error) or ended otherwise; its final state says which.
                if error.code not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED):
                    raise
                stream.abort()
        except BaseException:
            stream.abort()
            try:
                self.cancel(job)
            except RecalError:
                pass
            raise
        return self._results(relay.wait(), out, bn_out, report)

    # ----------------------------------------------------------------------- all in one

    def recalibrate(self, model_path, data, out=None, batch_size=32, max_batches=None, bn_out=None,
                    report=None, on_progress=None, on_queued=None, folded_out=None, **options):
        """Uploads `model_path` (unless the server has it), runs a job on `data` (a spec as in
        submit(), server-side paths), waits for it and downloads the recalibrated model to
        `out`, the BatchNorm buffers to `bn_out`, the folded model to `folded_out` (which
        submits with fold_batch_norm=True) and the JSON report to `report` (each when
        given; the report with ints as ints, as recal.to_json writes it, where the server's
        artifact, which download() keeps byte for byte, has int64s as strings). Other keyword
        arguments go to submit() (engine options, priority, timeout_seconds, labels,
        request_id). Returns the final Job; raises RecalError (with
        .code and .job) if the job FAILED or was CANCELLED."""
        model = self.upload_model(model_path)
        if folded_out is not None:
            options["fold_batch_norm"] = True
        job = self.submit(model, data, batch_size=batch_size, max_batches=max_batches, **options)
        return self._results(self.wait(job, on_progress, on_queued), out, bn_out, report, folded_out)

    def _results(self, job, out, bn_out, report, folded_out=None):
        """The ended `job` once it SUCCEEDED (RecalError otherwise), its artifacts downloaded
        to the paths given."""
        if job.state != recal_pb2.SUCCEEDED:
            raise RecalError.from_job(job)
        for target, artifact in ((out, "model"), (bn_out, "bn"), (folded_out, "folded"), (report, "report")):
            if target is not None:
                self.download(job, target, artifact)
        if report is not None:
            _write_atomically(report, messages.to_json(messages.read_report(report)))
        return job
