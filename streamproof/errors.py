"""Errors a user can act on. Each carries one line saying what is wrong and how to fix it.

The CLI prints ``error: <message>`` and exits with :attr:`StreamproofError.exit_code`; no traceback
is shown for any of these (DESIGN: exit 2 = bad input, 1 = loss or duplicates found).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class StreamproofError(Exception):
    """Base of the errors the CLI turns into one line and an exit code."""

    exit_code = 2


class ConfigError(StreamproofError):
    """The pipeline file or a command-line argument is invalid."""


class SetupError(StreamproofError):
    """Something the machine needs (java, mvn, jars, postgres) is missing or broken."""


class InfraError(StreamproofError):
    """The local Kafka broker or PostgreSQL server could not be started, reached or stopped."""


class PipelineError(StreamproofError):
    """A pipeline failed for a reason the user can act on (e.g. the topic does not exist)."""


class SinkReplaced(PipelineError):
    """A sink's storage is no longer the one the running pipeline read (a Delta table dropped and created again): an
    answer of the sink's head, where any other failure to read it means "unknown, look again next batch"."""


# Delta's conflicts that its docs say to retry: another transaction committed first what this one read or deleted.
# Matched by class (a JVM trace) and by error class (PySpark's captured exception says only that).
DELTA_CONFLICTS = (
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "[DELTA_CONCURRENT_APPEND",
    "[DELTA_CONCURRENT_DELETE_READ",
    "[DELTA_CONCURRENT_DELETE_DELETE",
)


def is_delta_conflict(error: BaseException | str) -> bool:
    """Whether a Delta write failed because another writer committed first what it read (worth retrying at once).

    >>> is_delta_conflict("io.delta.exceptions.ConcurrentAppendException: [DELTA_CONCURRENT_APPEND.WITHOUT_HINT] ...")
    True
    >>> is_delta_conflict("[DELTA_CONCURRENT_DELETE_READ] Transaction conflict detected. ...")
    True
    >>> is_delta_conflict("io.delta.exceptions.ConcurrentTransactionException: ...")  # a second writer of its appId
    False
    """
    text = f"{type(error).__name__}: {error}"
    return any(sign in text for sign in DELTA_CONFLICTS)


def retrying_delta_conflicts(write: Callable[[], T], attempts: int = 5) -> T:
    """``write()``, run again (up to ``attempts`` in all) while Delta fails it on another writer's commit of what it
    read: nothing of it was committed, and the next try reads the new snapshot, as Delta's docs advise.

    >>> tries = iter([RuntimeError("[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] ..."), "committed"])
    >>> def write():
    ...     outcome = next(tries)
    ...     if isinstance(outcome, Exception):
    ...         raise outcome
    ...     return outcome
    >>> retrying_delta_conflicts(write)
    'committed'
    """
    for _ in range(1, attempts):
        try:
            return write()
        except Exception as error:
            if not is_delta_conflict(error):
                raise
    return write()


# Failures that go away when a server comes back: connection refused or reset, a broker, database or
# DataNode restarting. Matched on the error text, since they reach Python as Py4J, psycopg or librdkafka errors.
TRANSIENT_SIGNS = (
    "Connection refused",
    "connection failed",
    "could not connect",
    "server closed the connection",
    "terminating connection due to administrator command",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "consuming input failed",
    "Broker transport failure",
    "All broker connections are down",
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "TimeoutException: Timed out waiting",
    "Timeout while fetching",
    "DisconnectException",
    "NetworkException",
    "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
    # Kafka: a partition's leader moved (a broker of a cluster killed, or paused and fenced).
    "FENCED_LEADER_EPOCH",
    "NOT_LEADER_OR_FOLLOWER",
    "NOT_LEADER_FOR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    "UNKNOWN_LEADER_EPOCH",
    # HDFS: no DataNode could take a block (all down or restarting), the NameNode starting up or failing over.
    "minReplication nodes",
    "are bad. Aborting",
    "SafeModeException",
    "RetriableException",
    "StandbyException",
    # S3 (the AWS SDK's messages): a server restarting answers 500 InternalError, a throttled one 503 SlowDown.
    "We encountered an internal error, please try again",
    "Please reduce your request rate",
    "AWSStatus500Exception",
    "AWSServiceThrottledException",
    "Service Unavailable",
    # Delta: another writer committed first what this commit read (an OPTIMIZE beside a MERGE): nothing was committed,
    # and the write is retried on the new snapshot. The Delta sink retries it in place (sinks/delta.py); these catch a
    # conflict of any other Delta write.
    *DELTA_CONFLICTS,
)


def is_transient(error: BaseException | str) -> bool:
    """Whether an error looks like a server being briefly away (worth retrying), from its text.

    >>> is_transient("psycopg.OperationalError: connection failed: Connection refused")
    True
    >>> is_transient("could only be written to 0 of the 1 minReplication nodes. There are 1 datanode(s) running")
    True
    >>> is_transient("column amount does not exist")
    False
    """
    text = str(error)
    if _OWN_ERROR.search(text):  # streamproof already decided (e.g. an outage past its bound): final
        return False
    return any(sign in text for sign in TRANSIENT_SIGNS)


_OWN_ERROR = re.compile(r"streamproof\.errors\.\w+Error: (.+)")
_PYTHON_TRACEBACK = "Python Proxy. Return Message: Traceback"
_PYTHON_RAISED = re.compile(
    r"^((?:OSError|IOError|ConnectionError|TimeoutError|RuntimeError|ValueError): .+)$", re.MULTILINE
)
_TRACE_NOISE = ("Traceback", "File ", "at ", "^", "~", "During handling", "The above exception")


def first_line(error: BaseException | str, limit: int = 300) -> str:
    """The line of an error worth showing: a streamproof error's own message when one is wrapped in a
    Py4J or Spark error (raised inside a batch), else the first meaningful line.

    >>> first_line("Py4JJavaError: ...\\nTraceback ...\\nstreamproof.errors.PipelineError: ledger mismatch\\n")
    'ledger mismatch'
    >>> first_line("An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\\n"
    ...            '  File "storage.py", line 186, in read_bytes\\nOSError: s3a://b/offsets/78: 500\\n SQLSTATE: 39000')
    'OSError: s3a://b/offsets/78: 500'
    """
    text = str(error)
    own = _OWN_ERROR.findall(text)
    if own:  # written by streamproof to be read whole (its path and the command to run are at its end)
        return own[-1].strip()
    raised_in_batch = _PYTHON_RAISED.findall(text) if _PYTHON_TRACEBACK in text else []
    if raised_in_batch:  # an exception of streamproof's batch code, under Spark's and Py4J's wrapping: its own line
        return raised_in_batch[-1].strip()[:limit]
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith(_TRACE_NOISE):
            return stripped[:limit]
    return text.strip()[:limit] or type(error).__name__


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log, to show under an error line (``(no log)`` when there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
