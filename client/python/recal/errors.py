"""RecalError: every failure the client reports, with the gRPC status code."""

import grpc


def status_code(value):
    """grpc.StatusCode for a StatusCode, its name, or its number (google.rpc.Code)."""
    if isinstance(value, grpc.StatusCode):
        return value
    for code in grpc.StatusCode:
        if value == code.value[0] or (isinstance(value, str) and value.upper() == code.name):
            return code
    return grpc.StatusCode.UNKNOWN


class RecalError(Exception):
    """A failed call or job.

    code: the grpc.StatusCode (for a failed job, the code the server gave its failure;
    CANCELLED for a cancelled job). message: the server's message, readable as is.
    job: the final Job message when a job failed or was cancelled, else None.
    """

    def __init__(self, code, message, job=None):
        self.code = status_code(code)
        self.message = message
        self.job = job
        super().__init__("%s: %s" % (self.code.name, message))

    @classmethod
    def from_rpc_error(cls, error, context=None):
        """Translates a grpc.RpcError (the server's code and message)."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else None
        message = details or str(error)
        if context:
            message = "%s: %s" % (context, message)
        return cls(code, message)

    @classmethod
    def from_job(cls, job):
        """For a job that ended FAILED or CANCELLED."""
        from recal._proto.recal.v1 import recal_pb2

        state = recal_pb2.JobState.Name(job.state)
        if job.error.code:
            code = status_code(job.error.code)
        elif job.state == recal_pb2.CANCELLED:
            code = grpc.StatusCode.CANCELLED
        else:
            code = grpc.StatusCode.UNKNOWN
        message = "job %s %s" % (job.id, state)
        if job.error.message:
            message += ": " + job.error.message
        return cls(code, message, job=job)
