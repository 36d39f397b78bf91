"""Domain errors every service's core raises. They know nothing of gRPC: the bootstrap's interceptor
(`scalerl.serving.ErrorInterceptor`) maps each class to one status code in one table, and logs it once with
the job id as a field."""

from __future__ import annotations


class ScaleRLError(Exception):
    """Base of the errors a caller can act on. `field` names the offending request field, when one does."""

    def __init__(self, message: str, *, field: str | None = None, job_id: str | None = None):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.job_id = job_id


class InvalidArgument(ScaleRLError, ValueError):
    """The request is malformed or out of range (the caller must change it)."""


class NotFound(ScaleRLError, KeyError):
    """The job, version or other named thing does not exist (any more)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return Exception.__str__(self)


class AlreadyExists(ScaleRLError):
    """The thing to create exists already."""


class FailedPrecondition(ScaleRLError):
    """The request is valid but not in the current state (wrong role, conflicting recipe, finished job)."""


class ResourceExhausted(ScaleRLError):
    """A bound was hit (message size, pinned versions, quota)."""


class Unavailable(ScaleRLError):
    """A dependency is down or not ready yet: retrying later can succeed."""
