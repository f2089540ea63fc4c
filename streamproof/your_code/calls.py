"""The calls that make something durable, watched while your own sink's write runs: each one that returns is a step
of the write (:mod:`streamproof.your_code.steps` numbers them into the moments a proof crashes at).

* a Spark write: ``DataFrameWriter.save`` / ``saveAsTable`` / ``insertInto`` / ``jdbc`` / ``parquet`` / ``orc`` /
  ``json`` / ``csv`` / ``text`` / ``xml``, ``DataFrameWriterV2.append`` / ``overwrite`` / ``create`` / ...,
  ``MergeIntoWriter.merge``;
* a Delta commit made through Delta's Python API: ``merge(...).execute()``, ``update``, ``delete``, a table builder's
  ``execute``, ``restoreToVersion`` / ``restoreToTimestamp``, and ``spark.sql`` of a statement that writes;
* a DB-API commit: psycopg's ``Connection.commit`` with a transaction open (also the one its ``with`` block makes),
  the end of an outer ``transaction()`` block that committed; psycopg2's, sqlite3's and confluent-kafka's
  ``Producer.commit_transaction``, methods written in C, seen through a profile hook as they return (their
  subclasses too); a JDBC ``commit`` called through Py4J;
* a job that runs your code in tasks (``RDD.foreachPartition``, ``foreach``): handed to the ``task_job`` given to
  :func:`install`, whose tasks count their own commits.

Nested calls count once (a ``saveAsTable`` that runs a ``save``). A step taken in another thread than the write's
(a thread pool of your own) cannot be crashed at: it is recorded as unseen (``steps.unseen``), and the proof says so.

Example::

    >>> writing_statement("  insert into t select * from s"), writing_statement("SELECT 1")
    ('INSERT INTO t', None)
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

Describe = Callable[[tuple[Any, ...], dict[str, Any], Any], str | None]

_ACTIVE: dict[int, Any] = {}  # thread id -> the steps counted in it (a WriteSteps or a TaskSteps)


def active() -> Any | None:
    """The steps counted in this thread, when none of their counted calls is running."""
    steps = _ACTIVE.get(threading.get_ident())
    return None if steps is None or steps.depth else steps


def current() -> Any | None:
    """The steps counted in this thread, whatever runs (what :func:`streamproof.this_batch` reads)."""
    return _ACTIVE.get(threading.get_ident())


def _unseen(what: str) -> None:
    """A durable call returned in a thread that counts nothing while a write counts in another: when exactly one
    write counts, it is that write's, and no crash can land after it."""
    writes = [steps for steps in list(_ACTIVE.values()) if hasattr(steps, "unseen")]
    if len(writes) == 1:
        writes[0].unseen.append(what)


@contextlib.contextmanager
def counting_in_this_thread(steps: Any) -> Iterator[Any]:
    """Count ``steps`` in this thread for the length of the block, C commits included (the profile hook, here and in
    the threads started meanwhile, where they are unseen steps)."""
    thread = threading.get_ident()
    outer, profile = _ACTIVE.get(thread), sys.getprofile()
    _ACTIVE[thread] = steps
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    try:
        yield steps
    finally:
        sys.setprofile(profile)
        threading.setprofile(None)  # type: ignore[arg-type]
        if outer is None:
            _ACTIVE.pop(thread, None)
        else:
            _ACTIVE[thread] = outer


def _redacted(text: str) -> str:
    """A place without what could be a secret: a URL's query (``?password=...``) and user info dropped.

    >>> _redacted("jdbc:postgresql://u:p@db:5432/shop?password=x")
    'jdbc:postgresql://db:5432/shop'
    """
    return re.sub(r"//[^/@]*@", "//", text.split("?", 1)[0].split(";", 1)[0])


def _described(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``DataFrameWriter.save('/data/orders')``: the call and its first argument that names a place (a path, a
    table; for ``jdbc``, the table, never the URL)."""
    first = args[2:3] if name.endswith(".jdbc") else args[1:2]
    named = [value for value in (*first, kwargs.get("path"), kwargs.get("table")) if isinstance(value, str)]
    return f"{name}({_redacted(named[0])!r})" if named else f"{name}()"


def _counted(name: str, describe: Describe | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A method made a step: when it returns (not when it raises) inside your write, the write took a step."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def counted(*args: Any, **kwargs: Any) -> Any:
            steps = _ACTIVE.get(threading.get_ident())
            if steps is not None and steps.depth:
                return method(*args, **kwargs)
            if steps is None:
                result = method(*args, **kwargs)
                if _ACTIVE and (what := _what(name, describe, args, kwargs, result)) is not None:
                    _unseen(what)
                return result
            steps.depth += 1
            try:
                result = method(*args, **kwargs)
            finally:
                steps.depth -= 1
            if (what := _what(name, describe, args, kwargs, result)) is not None:
                steps.took(what)
            return result

        counted.__streamproof_counted__ = True  # type: ignore[attr-defined]
        return counted

    return wrap


def _what(
    name: str, describe: Describe | None, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
) -> str | None:
    return describe(args, kwargs, result) if describe is not None else _described(name, args, kwargs)


WRITING_STATEMENTS = {
    "INSERT",
    "MERGE",
    "UPDATE",
    "DELETE",
    "CREATE",
    "REPLACE",
    "TRUNCATE",
    "DROP",
    "ALTER",
    "COPY",
    "RESTORE",
    "OPTIMIZE",
    "VACUUM",
}
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
_TEMPORARY = re.compile(r"^(CREATE|REPLACE)\s+(OR\s+REPLACE\s+)?(GLOBAL\s+)?TEMP(ORARY)?\s", re.IGNORECASE)


def writing_statement(query: str) -> str | None:
    """The statement's first words when it writes (a step), None for a query or a temporary view.

    >>> writing_statement("/* nightly */ (INSERT INTO t SELECT * FROM s)")
    'INSERT INTO t'
    >>> writing_statement("WITH n AS (SELECT 1 AS x) INSERT INTO t SELECT * FROM n")
    'WITH ... INSERT'
    >>> writing_statement("CREATE OR REPLACE TEMP VIEW v AS SELECT 1"), writing_statement("DELETE FROM temp")
    (None, 'DELETE FROM temp')
    """
    text = _COMMENTS.sub(" ", query).strip().lstrip("(").strip()
    words = text.split()
    if not words:
        return None
    first = words[0].upper()
    if first == "WITH":
        found = next((word.upper() for word in words if word.upper() in WRITING_STATEMENTS), None)
        return f"WITH ... {found}" if found else None
    if first not in WRITING_STATEMENTS or _TEMPORARY.match(text):
        return None
    return " ".join([word.upper() for word in words[:2]] + words[2:3])


def _sql_step(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> str | None:
    query = args[1] if len(args) > 1 else kwargs.get("sqlQuery", "")
    statement = writing_statement(query) if isinstance(query, str) else None
    return f"spark.sql {statement} ..." if statement else None


def _py4j_commit(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> str | None:
    return "JDBC commit" if getattr(args[0], "name", None) == "commit" else None  # a py4j call of conn.commit()


_INSTALLED = False
_INSTALL_LOCK = threading.Lock()


def install(task_job: Callable[[Callable[..., Any], str, Callable[..., Any]], Callable[..., Any]]) -> None:
    """Make the calls of the module docstring steps, once per process (a no-op outside a write): in the driver when
    your write runs, in a Python worker when one of its tasks does. ``task_job(method, name, each_partition)`` wraps
    ``RDD.foreachPartition`` / ``foreach`` (``each_partition``: the original ``RDD.foreachPartition``)."""
    global _INSTALLED
    with _INSTALL_LOCK:
        if _INSTALLED:
            return
        _INSTALLED = True
        from pyspark import RDD
        from pyspark.sql import SparkSession
        from pyspark.sql.readwriter import DataFrameWriter, DataFrameWriterV2

        for name in ("save", "saveAsTable", "insertInto", "jdbc", "parquet", "orc", "json", "csv", "text", "xml"):
            _patch(DataFrameWriter, name, f"DataFrameWriter.{name}")
        for name in ("append", "overwrite", "overwritePartitions", "create", "replace", "createOrReplace"):
            _patch(DataFrameWriterV2, name, f"DataFrameWriterV2.{name}")
        _patch(SparkSession, "sql", "spark.sql", _sql_step)
        with contextlib.suppress(ImportError):
            from pyspark.sql.merge import MergeIntoWriter

            _patch(MergeIntoWriter, "merge", "MergeIntoWriter.merge")
        with contextlib.suppress(ImportError):
            from delta.tables import DeltaMergeBuilder, DeltaTable, DeltaTableBuilder

            _patch(DeltaMergeBuilder, "execute", "Delta merge(...).execute")
            _patch(DeltaTableBuilder, "execute", "Delta table builder execute")
            for name in ("update", "delete", "restoreToVersion", "restoreToTimestamp"):
                _patch(DeltaTable, name, f"DeltaTable.{name}")
        each_partition = RDD.foreachPartition
        for name in ("foreachPartition", "foreach"):
            setattr(RDD, name, task_job(getattr(RDD, name), name, each_partition))
        with contextlib.suppress(ImportError):
            import psycopg

            _patch_psycopg(psycopg)
        with contextlib.suppress(ImportError):
            from py4j.java_gateway import JavaMember

            _patch(JavaMember, "__call__", "JDBC commit", _py4j_commit)


def _patch(owner: type, name: str, label: str, describe: Describe | None = None) -> None:
    method = getattr(owner, name, None)
    if method is None or getattr(method, "__streamproof_counted__", False):
        return
    setattr(owner, name, _counted(label, describe)(method))


def _patch_psycopg(psycopg: Any) -> None:
    """psycopg's commits: ``Connection.commit`` when a transaction is open (a commit of nothing sends nothing), and
    the end of an outer ``with connection.transaction():`` block that committed."""
    commit, exit_block = psycopg.Connection.commit, psycopg.Transaction.__exit__
    idle = psycopg.pq.TransactionStatus.IDLE

    @functools.wraps(commit)
    def counted_commit(connection: Any) -> Any:
        steps = _ACTIVE.get(threading.get_ident())
        if not _ACTIVE or (steps is not None and steps.depth):
            return commit(connection)
        was_open = connection.info.transaction_status != idle
        if steps is None:  # another thread than the write's
            result = commit(connection)
            if was_open:
                _unseen("psycopg commit")
            return result
        steps.depth += 1
        try:
            result = commit(connection)
        finally:
            steps.depth -= 1
        if was_open:
            steps.took("psycopg commit")
        return result

    def describe(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> str | None:
        block = args[0]
        committed = getattr(block, "status", None) == getattr(block.Status, "COMMITTED", object())
        return "psycopg transaction commit" if committed and getattr(block, "_outer_transaction", False) else None

    psycopg.Connection.commit = counted_commit
    psycopg.Transaction.__exit__ = _counted("psycopg transaction", describe)(exit_block)


# Commits of clients written in C, whose methods cannot be replaced: seen through the profile hook as they return.
C_COMMITS = {
    ("cimpl", "Producer", "commit_transaction"): "Kafka commit_transaction",
    ("psycopg2.extensions", "connection", "commit"): "psycopg2 commit",
    ("sqlite3", "Connection", "commit"): "sqlite3 commit",
}


def c_commit(function: Any) -> str | None:
    """What a C method is, when it is a commit of :data:`C_COMMITS` (of the class named, or of a subclass).

    >>> import sqlite3
    >>> class Mine(sqlite3.Connection): ...
    >>> c_commit(Mine(":memory:").commit), c_commit(sqlite3.connect(":memory:").close)
    ('sqlite3 commit', None)
    """
    name = getattr(function, "__name__", "")
    for owner in type(getattr(function, "__self__", None)).__mro__:
        found = C_COMMITS.get((owner.__module__, owner.__name__, name))
        if found is not None:
            return found
    return None


def _profile(frame: Any, event: str, arg: Any) -> None:
    if event != "c_return" or (what := c_commit(arg)) is None:
        return
    steps = _ACTIVE.get(threading.get_ident())
    if steps is None:
        _unseen(what)
    elif not steps.depth:
        steps.took(what)
