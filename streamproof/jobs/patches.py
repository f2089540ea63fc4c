"""The patches that steer a job's streaming queries without editing it: PySpark's own classes, replaced for the length
of the run and put back after (pytest's ``monkeypatch``: each patch recorded, each undone, each named).

A job builds its queries with ``spark.readStream ... .load()`` and ``df.writeStream ... .start()``. PySpark keeps what
was set in the JVM (``DataStreamReader._jreader``, ``DataStreamWriter._jwrite``), so the patches see every call on its
way there: an option's value is mapped first (:mod:`streamproof.jobs.maps`), and what the job chose is kept in a
Python copy (``_streamproof`` on the reader or writer) for the run to decide on at ``load()`` and ``start()``:

* ``SparkSession.builder``: ``getOrCreate()`` returns the session streamproof started (its jars, its checkpoint
  manager, a sandboxed warehouse), the job's runtime settings applied to it, the others listed as not applied;
  ``remote()`` is refused (Spark Connect);
* ``DataStreamReader``: ``option``/``options``/``load``/``format`` and the file readers (paths mapped, brokers to
  ``--kafka``, topics through ``--topic``; at ``load()`` the run's source overrides);
* ``DataStreamWriter``: ``option``/``options``/``trigger``/``queryName``/``foreachBatch``/``foreach``/``start``/
  ``toTable`` (the trigger becomes ``availableNow`` at ``start()``, a continuous one is refused; your functions are
  wrapped so their durable steps are counted and crashed at);
* ``StreamingQuery.awaitTermination`` and ``StreamingQueryManager.awaitAnyTermination`` (every query drains).

The patches touch PySpark's private fields ``_jreader``, ``_jwrite``, ``_df`` and ``_options``:
``tests/test_jobs_units.py::test_the_private_fields_the_patches_use_exist_in_this_pyspark`` fails when PySpark renames
one.

Example::

    >>> patches = Patches()
    >>> class Thing:
    ...     def hello(self): return "hello"
    >>> patches.replace(Thing, "hello", lambda self: "patched")
    >>> Thing().hello(), patches.names()
    ('patched', ['Thing.hello'])
    >>> patches.undo(); Thing().hello()
    'hello'
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

from streamproof.errors import ConfigError
from streamproof.jobs.record import QueryRecord


class JobRun(Protocol):
    """What the patches ask of the run they steer (:class:`streamproof.jobs.child.JobRun`)."""

    def session_for_job(self, builder: Any, get_or_create: Callable[[], Any]) -> Any: ...
    def path(self, value: Any, where: str, *, writing: bool) -> Any: ...
    def reader_option(self, state: dict[str, Any], key: str, value: Any) -> Any: ...
    def before_load(self, reader: Any, state: dict[str, Any], set_option: Callable[[str, Any], Any]) -> Any: ...
    def writer_option(self, state: dict[str, Any], key: str, value: Any) -> Any: ...
    def foreach_batch(self, writer: Any, function: Callable[..., Any]) -> Callable[..., Any]: ...
    def foreach(self, writer: Any, written: Any) -> Callable[..., Any]: ...
    def before_start(
        self, writer: Any, state: dict[str, Any], path: str | None, table: str | None, set_trigger: Callable[..., Any]
    ) -> QueryRecord: ...
    def after_start(self, started: Any, query: QueryRecord) -> Any: ...
    def await_query(self, query: Any, wait: Callable[[], Any]) -> Any: ...
    def await_every_query(self, manager: Any) -> bool: ...


_MISSING = object()
STATE = "_streamproof"  # the Python copy of what the job set on a reader or writer


class Patches:
    """Replacements of attributes, each recorded and undone in reverse order (see the module)."""

    def __init__(self) -> None:
        self._done: list[tuple[Any, str, Any]] = []

    def replace(self, owner: Any, name: str, new: Any) -> None:
        original = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)
        self._done.append((owner, name, original))
        setattr(owner, name, new)

    def original(self, owner: Any, name: str) -> Any:
        """What ``owner.name`` was before it was patched (the first patch of it)."""
        for patched_owner, patched_name, original in self._done:
            if patched_owner is owner and patched_name == name:
                return original
        return getattr(owner, name)

    def names(self) -> list[str]:
        return [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, _ in self._done]

    def undo(self) -> None:
        while self._done:
            owner, name, original = self._done.pop()
            if original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def state_of(holder: Any) -> dict[str, Any]:
    """The Python copy of what the job set on a reader or writer (format, options as written, trigger, ...)."""
    found = holder.__dict__.get(STATE)
    if found is None:
        found = {"format": None, "options": {}, "written": {}, "trigger": None, "query_name": None}
        holder.__dict__[STATE] = found
    return found


def install_stream_patches(patches: Patches, run: JobRun) -> None:
    """Patch the session builder, the stream reader and writer, and the waits (see the module)."""
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamReader, DataStreamWriter, StreamingQuery, StreamingQueryManager

    _patch_builder(patches, run, SparkSession.Builder)
    _patch_reader(patches, run, DataStreamReader)
    _patch_writer(patches, run, DataStreamWriter)
    await_termination = StreamingQuery.awaitTermination

    @functools.wraps(await_termination)
    def awaited(query: Any, timeout: int | None = None) -> Any:
        return run.await_query(query, lambda: await_termination(query, timeout))

    patches.replace(StreamingQuery, "awaitTermination", awaited)

    @functools.wraps(StreamingQueryManager.awaitAnyTermination)
    def await_any(manager: Any, timeout: int | None = None) -> Any:
        return run.await_every_query(manager)

    patches.replace(StreamingQueryManager, "awaitAnyTermination", await_any)


def _patch_builder(patches: Patches, run: JobRun, builder: Any) -> None:
    def remote(self: Any, url: str) -> Any:
        raise ConfigError(
            f"SparkSession.builder.remote({url!r}) is Spark Connect: the job's code would run in a server's worker "
            "that streamproof cannot crash or watch; build the session without .remote"
        )

    get_or_create = builder.getOrCreate

    @functools.wraps(get_or_create)
    def got(self: Any) -> Any:
        return run.session_for_job(self, lambda: get_or_create(self))

    patches.replace(builder, "remote", remote)
    patches.replace(builder, "getOrCreate", got)


def _patch_reader(patches: Patches, run: JobRun, reader: Any) -> None:
    option, load, format_ = reader.option, reader.load, reader.format

    def set_format(self: Any, source: str) -> Any:
        state_of(self)["format"] = str(source).lower()
        return format_(self, source)

    def set_option(self: Any, key: str, value: Any) -> Any:
        state = state_of(self)
        mapped = run.reader_option(state, key, value)
        state["written"][key.lower()] = value
        state["options"][key.lower()] = mapped
        return option(self, key, mapped)

    def set_options(self: Any, **options: Any) -> Any:
        for key, value in options.items():
            set_option(self, key, value)
        return self

    def loaded(
        self: Any, path: str | None = None, format: str | None = None, schema: Any = None, **options: Any
    ) -> Any:
        if format is not None:
            set_format(self, format)
        if schema is not None:
            self.schema(schema)
        set_options(self, **options)
        state = state_of(self)
        mapped = run.path(path, "readStream.load(path)", writing=False) if path is not None else None
        batch = run.before_load(self, state, lambda key, value: option(self, key, value))
        if batch is not None:  # a recomputation reads the same records as one batch (streamproof.jobs.recompute)
            return batch
        return load(self, mapped) if mapped is not None else load(self)

    patches.replace(reader, "format", set_format)
    patches.replace(reader, "option", set_option)
    patches.replace(reader, "options", set_options)
    patches.replace(reader, "load", loaded)
    for name in ("json", "parquet", "orc", "text", "csv", "xml"):
        if hasattr(reader, name):
            patches.replace(reader, name, _file_reader(run, getattr(reader, name), name))


def _file_reader(run: JobRun, method: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def read(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        state_of(self)["format"] = name
        return method(self, run.path(path, f"readStream.{name}(path)", writing=False), *args, **kwargs)

    return read


def _patch_writer(patches: Patches, run: JobRun, writer: Any) -> None:
    option, trigger, format_ = writer.option, writer.trigger, writer.format
    query_name, foreach_batch, start, to_table = writer.queryName, writer.foreachBatch, writer.start, writer.toTable

    def set_format(self: Any, source: str) -> Any:
        state_of(self)["format"] = str(source).lower()
        return format_(self, source)

    def set_option(self: Any, key: str, value: Any) -> Any:
        state = state_of(self)
        mapped = run.writer_option(state, key, value)
        state["written"][key.lower()] = value
        state["options"][key.lower()] = mapped
        return option(self, key, mapped)

    def set_options(self: Any, **options: Any) -> Any:
        for key, value in options.items():
            set_option(self, key, value)
        return self

    def set_trigger(self: Any, **kwargs: Any) -> Any:
        if "continuous" in kwargs:
            raise ConfigError(
                f"trigger(continuous={kwargs['continuous']!r}) has no micro-batches to crash between, and Spark gives "
                "it at-least-once only: use processingTime or availableNow"
            )
        state_of(self)["trigger"] = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
        return trigger(self, **kwargs)

    def set_name(self: Any, name: str) -> Any:
        state_of(self)["query_name"] = name
        return query_name(self, name)

    def set_foreach_batch(self: Any, func: Callable[..., Any]) -> Any:
        state_of(self)["format"] = "foreachBatch"
        state_of(self)["function"] = func
        return foreach_batch(self, run.foreach_batch(self, func))

    def set_foreach(self: Any, writer_or_function: Any) -> Any:
        state_of(self)["format"] = "foreach"
        state_of(self)["function"] = writer_or_function
        return foreach_batch(self, run.foreach(self, writer_or_function))

    def apply(self: Any, options: dict[str, Any], settings: dict[str, Any]) -> None:
        set_options(self, **options)
        if settings.get("outputMode") is not None:
            self.outputMode(settings["outputMode"])
        if settings.get("partitionBy") is not None:
            self.partitionBy(settings["partitionBy"])
        if settings.get("format") is not None:
            set_format(self, settings["format"])
        if settings.get("queryName") is not None:
            set_name(self, settings["queryName"])

    def started(
        self: Any,
        path: str | None = None,
        format: str | None = None,
        outputMode: str | None = None,  # noqa: N803 - PySpark's own parameter names
        partitionBy: Any = None,  # noqa: N803
        queryName: str | None = None,  # noqa: N803
        **options: Any,
    ) -> Any:
        settings = {"format": format, "outputMode": outputMode, "partitionBy": partitionBy, "queryName": queryName}
        apply(self, options, settings)
        query = run.before_start(self, state_of(self), path, None, lambda **kw: trigger(self, **kw))
        result = start(self, query.location) if query.location is not None and path is not None else start(self)
        return run.after_start(result, query)

    def to_tabled(
        self: Any,
        tableName: str,  # noqa: N803
        format: str | None = None,
        outputMode: str | None = None,  # noqa: N803
        partitionBy: Any = None,  # noqa: N803
        queryName: str | None = None,  # noqa: N803
        **options: Any,
    ) -> Any:
        settings = {"format": format, "outputMode": outputMode, "partitionBy": partitionBy, "queryName": queryName}
        apply(self, options, settings)
        query = run.before_start(self, state_of(self), None, tableName, lambda **kw: trigger(self, **kw))
        return run.after_start(to_table(self, tableName), query)

    patches.replace(writer, "format", set_format)
    patches.replace(writer, "option", set_option)
    patches.replace(writer, "options", set_options)
    patches.replace(writer, "trigger", set_trigger)
    patches.replace(writer, "queryName", set_name)
    patches.replace(writer, "foreachBatch", set_foreach_batch)
    patches.replace(writer, "foreach", set_foreach)
    patches.replace(writer, "start", started)
    patches.replace(writer, "toTable", to_tabled)


PRIVATE_FIELDS = {
    "pyspark.sql.streaming.readwriter.DataStreamReader": ("_jreader", "_spark"),
    "pyspark.sql.streaming.readwriter.DataStreamWriter": ("_jwrite", "_df", "_spark"),
    "pyspark.sql.session.SparkSession.Builder": ("_options",),
}
