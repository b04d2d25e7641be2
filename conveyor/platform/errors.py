"""The agent platform's errors, each under a base of the library's tree (:mod:`conveyor.errors`).

The library's one error-to-status table (:mod:`conveyor.api.errors`) answers them through those
bases: a quota at its limit is a :class:`~conveyor.errors.LimitExceeded` (429), an upload refused an
:class:`~conveyor.errors.EnqueueError` (422; too large: 413), a missing record the library's
:class:`~conveyor.errors.RecordNotFound` (404). Nothing here names HTTP.
"""

from __future__ import annotations

from conveyor.errors import (
    ConveyorError,
    EnqueueError,
    JobError,
    LimitExceeded,
    PayloadTooLarge,
    PermanentError,
    RetryLater,
)


class PlatformError(ConveyorError):
    """The agent platform refused a request about its records."""


class QuotaExceeded(LimitExceeded, PlatformError):
    """A user is at one of their limits (active runs, open streams, stream data kept): try again later.

    The message names the limit and its setting, never the request's values.
    """


class InjectedFault(JobError):
    """A failure injected on purpose (``CONVEYOR_FAULT_RATE``) to exercise retries."""


class ProviderError(JobError):
    """The model provider failed in a way a retry may fix (5xx, dropped connection, timeout)."""


class ProviderRejected(PermanentError):
    """The model provider refused the request (4xx other than 429): a retry cannot help."""


class ProviderRateLimited(RetryLater, ProviderError):
    """The model provider, or conveyor's own rate limit, said: not now. Run again after ``delay``.

    A :class:`RetryLater` first (the job waits, no attempt spent); also a :class:`ProviderError`,
    so a caller of a provider catches every provider trouble with one ``except``.
    """


class BuildFailed(PermanentError):
    """A build can never succeed as requested (its build script failed, its archive is bad,
    its rollback target does not exist): the build and its agent or connector end ``failed``."""


class BuildTimeout(JobError):
    """A build ran past its kind's time limit; it is retried while attempts remain."""


class UnsafePath(BuildFailed):
    """A path made from a request would leave the directory it belongs in (``..``, a slash, a symlink out)."""


class SourceUnusable(BuildFailed):
    """A build's source cannot be used: not an upload or under a configured root, missing, corrupt, too large.

    One message for every reason, so a build request cannot probe the host's files.
    """


class SandboxUnavailable(JobError):
    """This worker cannot start the build sandbox (bubblewrap missing or refused): another worker may."""


class UploadRefused(EnqueueError):
    """An uploaded archive was not stored, so no build is enqueued: not a zip, malformed, or missing its fields."""


class UploadTooLarge(UploadRefused, PayloadTooLarge):
    """An uploaded archive is larger than ``CONVEYOR_UPLOAD_MAX_BYTES``; nothing was stored."""
