"""Errors inside the worker. Each maps to a job's ``error.type``.

WorkerError
├── ItemError            this one item is bad; its batch-mates are unaffected
│   ├── InvalidRequest   body fails the contract (``invalid_request``)
│   ├── ModelNotFound    no backend serves the model (``model_not_found``)
│   ├── ModelError       the model rejected this item (``model_error``)
│   ├── DeadlineShed     it could not finish before its deadline: expired early
│   ├── BudgetExceeded   a remote-only job of a tenant past its monthly remote budget
│   ├── RemoteRejected   the remote refused this request with a 4xx (``remote_rejected``)
│   └── StreamDiverged   a streamed job's re-run generated other text than its stream carries
├── StreamCancelled      cancelled while held (or its stream's reader went away): ends ``cancelled``
└── BackendError         the backend call failed as a whole
    ├── BackendUnavailable  cannot reach it / not ready: retry later or elsewhere
    │   └── RemoteUnavailable   the remote kept failing (connect, timeout, 5xx, 429) past its retries
    │       ├── RemoteLacks        it does not serve the endpoint or model (404, 405, 501): stay local
│       └── RemoteBadResponse  it answered 2xx with a body that is not the expected JSON
    ├── InferenceFailed     it answered with an error: split the batch to find the culprit
    └── StreamInterrupted   it failed after a streamed job's first token: no failover, the job fails
"""

from __future__ import annotations

from producer.contract import ErrorType, Route


class WorkerError(Exception):
    type = ErrorType.internal_error

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.route: Route | None = None  # the backend that failed it first, for its result


class ItemError(WorkerError):
    type = ErrorType.item_error


class InvalidRequest(ItemError):
    type = ErrorType.invalid_request


class ModelNotFound(ItemError):
    type = ErrorType.model_not_found


class ModelError(ItemError):
    type = ErrorType.model_error


class BackendError(WorkerError):
    type = ErrorType.backend_error


class BackendUnavailable(BackendError):
    type = ErrorType.backend_unavailable


class InferenceFailed(BackendError):
    type = ErrorType.inference_failed


class DeadlineShed(ItemError):
    """The work ahead of this job would take it past its deadline: it expires before inference,
    so the capacity goes to jobs whose callers are still waiting."""

    type = ErrorType.deadline_exceeded


class BudgetExceeded(ItemError):
    type = ErrorType.budget_exceeded


class RemoteRejected(ItemError):
    type = ErrorType.remote_rejected


class RemoteUnavailable(BackendUnavailable):
    type = ErrorType.remote_unavailable


class RemoteLacks(RemoteUnavailable):
    """The remote does not serve this endpoint or model (404, 405, 501, "not supported"): the
    remote's gap, not the job's fault; the job stays local."""

    type = ErrorType.remote_unsupported


class RemoteBadResponse(RemoteUnavailable):
    type = ErrorType.remote_bad_response


class StreamInterrupted(BackendError):
    """The backend failed after the first token had gone out: another backend would repeat or
    contradict it, so the stream ends with an error event and the job fails."""

    type = ErrorType.stream_interrupted


class StreamDiverged(ItemError):
    type = ErrorType.stream_diverged


class StreamCancelled(WorkerError):
    type = ErrorType.cancelled
