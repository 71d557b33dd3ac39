"""intentd: the Python worker library of intentd.

Typed calls with errors as exceptions (one class per ErrorInfo reason),
worker sessions that heartbeat on their own, and ``session.run(task)``, the
safe claim → act → report loop::

    import intentd

    client = intentd.Client("127.0.0.1:7650")
    with client.open_session("worker-7", ttl=15) as session:
        out = session.run(intentd.Task(key=key, execute=buy, reconcile=look_up))
        print(out.name, out.result.external_refs)

``pip install ./python`` installs it with the generated stubs it imports
(``intent.v1.intent_pb2``, for protobuf 6 and 7); on Debian's runtimes, put
the repository's ``python`` and ``gen/python`` directories on ``PYTHONPATH``
instead. :mod:`intentd.aio` is the same on asyncio.
"""

from importlib import metadata as _metadata

from .client import Client, new_request_id, struct
from .errors import (
    BY_REASON,
    Aborted,
    ArchiveUnavailable,
    FailedPrecondition,
    FingerprintMismatch,
    IntentdError,
    IntentExpired,
    IntentNotFound,
    Internal,
    InvalidArgument,
    InvalidField,
    InvalidTransition,
    LeaseHeld,
    LeaseLost,
    NotFound,
    PermissionDenied,
    RateLimited,
    ResourceExhausted,
    ResultMismatch,
    RevisionCompacted,
    SessionLost,
    SessionNotFound,
    StaleToken,
    StoreFull,
    StoreRolledBack,
    StoreUnavailable,
    TooLarge,
    Unauthenticated,
    Unavailable,
)
from .guard import Answer, GuardedTool, Ledger, current_attempt, guarded
from .run import Attempt, Evidence, Final, NotAttempted, Outcome, Task, absent, found, undecided
from .session import Session

try:
    __version__ = _metadata.version("intentd")
    """The installed wheel's version (the project's release version)."""
except _metadata.PackageNotFoundError:  # imported from a clone, not installed
    __version__ = "0.0.0"

__all__ = [name for name in dir() if not name.startswith("_")]
