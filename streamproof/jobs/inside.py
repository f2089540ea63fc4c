"""The patches that keep what a job does inside its batches (and around them) off production: the paths it reads and
writes with Spark and Delta, the SQL it runs, the databases and brokers its own clients connect to.

A ``foreachBatch`` function writes with ``batch_df.write ... .save(path)``, merges with ``DeltaTable.forPath(spark,
path)``, runs ``spark.sql("MERGE INTO delta.`s3://...`")``, connects with ``psycopg.connect("host=orders-db ...")``
or produces with ``confluent_kafka.Producer({"bootstrap.servers": ...})``; a ``ForeachWriter`` does the same from a
task, in a Python worker. Every such address passes through the run's :class:`~streamproof.jobs.maps.AddressMaps`
(an unmapped production one is refused before the call reaches it), and every place written is recorded as an output
the proof compares (in the driver; a worker only maps). The descriptions of your write's durable steps keep the job's
own addresses (:mod:`streamproof.your_code.calls` counts around these patches), the same in every sandbox.

Example::

    >>> from streamproof.jobs.maps import AddressMaps, PathMap
    >>> steering = Steering(AddressMaps(paths=(PathMap("s3://prod/", "/tmp/p/"),)))
    >>> steering.mapped_path("s3://prod/delta/orders", "DataFrameWriter.save(path)", writing=True, format="delta")
    '/tmp/p/delta/orders'
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamproof.jobs.maps import AddressMaps, file_path, scheme_of
from streamproof.jobs.patches import Patches
from streamproof.jobs.record import JobRecord, Output, note_output

FILE_FORMATS = ("parquet", "json", "csv", "orc", "text", "xml")


@dataclass
class Steering:
    """The maps of the run, and (in the driver) its record, where outputs are noted."""

    maps: AddressMaps
    record: JobRecord | None = None
    query: str | None = None  # the query whose batch is being written, when one is
    folder: str | None = None  # in a worker: the run's state folder, where its outputs are noted (record.py)

    def mapped_path(self, value: Any, where: str, *, writing: bool, format: str | None = None) -> Any:
        if not isinstance(value, str):
            return value
        mapped = self.maps.path(value, where, writing=writing)
        if writing and format is not None:
            self.wrote(value, mapped, format)
        return mapped

    def wrote(self, address: str, location: str, format: str) -> None:
        """An output: in the record (the driver), or a note beside it (a worker: :func:`note_output`)."""
        if self.record is not None:
            self.record.wrote(address, location, format, self.query)
        elif self.folder is not None:
            note_output(Path(self.folder), address, Output(location, format, self.query))


_STEERING: Steering | None = None  # this process's: the driver's, or a worker's (maps only)


def steering() -> Steering | None:
    return _STEERING


def install_inside_patches(patches: Patches, steering: Steering) -> None:
    """Patch Spark's batch reader and writer, Delta's table handles, ``spark.sql``, psycopg and confluent-kafka."""
    global _STEERING
    _STEERING = steering
    _patch_spark_io(patches, steering)
    with contextlib.suppress(ImportError):
        _patch_delta(patches, steering)
    with contextlib.suppress(ImportError):
        import psycopg

        _patch_psycopg(patches, steering, psycopg)
    with contextlib.suppress(ImportError):
        import confluent_kafka

        _patch_confluent(patches, steering, confluent_kafka)
    _patch_tasks(patches, steering)


def _writer_format(writer: Any, default: str = "parquet") -> str:
    return str(writer.__dict__.get("_streamproof_format") or default)


def _patch_spark_io(patches: Patches, steering: Steering) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql.readwriter import DataFrameReader, DataFrameWriter

    writer_format, writer_option = DataFrameWriter.format, DataFrameWriter.option

    def set_format(self: Any, source: str) -> Any:
        self.__dict__["_streamproof_format"] = str(source).lower()
        return writer_format(self, source)

    def set_option(self: Any, key: str, value: Any) -> Any:
        if key.lower() == "path":
            value = steering.mapped_path(value, "write.option('path')", writing=True, format=_writer_format(self))
        elif key.lower() == "url" and isinstance(value, str):
            value = steering.maps.jdbc_url(value, "write.option('url')")
        return writer_option(self, key, value)

    def set_options(self: Any, **options: Any) -> Any:
        for key, value in options.items():
            set_option(self, key, value)
        return self

    patches.replace(DataFrameWriter, "format", set_format)
    patches.replace(DataFrameWriter, "option", set_option)
    patches.replace(DataFrameWriter, "options", set_options)

    save = DataFrameWriter.save

    @functools.wraps(save)
    def saved(self: Any, path: str | None = None, format: str | None = None, *args: Any, **kwargs: Any) -> Any:
        kind = (format or _writer_format(self)).lower()
        mapped = steering.mapped_path(path, f"DataFrameWriter.save({path!r})", writing=True, format=kind)
        return save(self, mapped, format, *args, **kwargs)

    patches.replace(DataFrameWriter, "save", saved)
    for name in FILE_FORMATS:
        if hasattr(DataFrameWriter, name):
            patches.replace(DataFrameWriter, name, _file_write(steering, getattr(DataFrameWriter, name), name))
    jdbc = DataFrameWriter.jdbc

    @functools.wraps(jdbc)
    def jdbc_write(self: Any, url: str, table: str, *args: Any, **kwargs: Any) -> Any:
        mapped = steering.maps.jdbc_url(url, "DataFrameWriter.jdbc(url)")
        steering.wrote(_database_of(url), _database_of(mapped), "postgresql")
        return jdbc(self, mapped, table, *args, **kwargs)

    patches.replace(DataFrameWriter, "jdbc", jdbc_write)
    for name in ("saveAsTable", "insertInto"):
        patches.replace(DataFrameWriter, name, _table_write(steering, getattr(DataFrameWriter, name), name))
    reader_load, reader_option = DataFrameReader.load, DataFrameReader.option

    @functools.wraps(reader_load)
    def loaded(self: Any, path: Any = None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(path, list):
            path = [steering.mapped_path(item, "read.load(path)", writing=False) for item in path]
        else:
            path = steering.mapped_path(path, f"read.load({path!r})", writing=False)
        return reader_load(self, path, *args, **kwargs)

    def read_option(self: Any, key: str, value: Any) -> Any:
        if key.lower() == "path":
            value = steering.mapped_path(value, "read.option('path')", writing=False)
        elif key.lower() == "url" and isinstance(value, str):
            value = steering.maps.jdbc_url(value, "read.option('url')")
        elif key.lower() == "kafka.bootstrap.servers" and isinstance(value, str):
            value = steering.maps.servers(value, "read.option('kafka.bootstrap.servers')")
        return reader_option(self, key, value)

    def read_options(self: Any, **options: Any) -> Any:
        for key, value in options.items():
            read_option(self, key, value)
        return self

    patches.replace(DataFrameReader, "load", loaded)
    patches.replace(DataFrameReader, "option", read_option)
    patches.replace(DataFrameReader, "options", read_options)
    for name in FILE_FORMATS:
        if hasattr(DataFrameReader, name):
            patches.replace(DataFrameReader, name, _file_read(steering, getattr(DataFrameReader, name), name))
    sql = SparkSession.sql

    @functools.wraps(sql)
    def sql_mapped(self: Any, sqlQuery: str, *args: Any, **kwargs: Any) -> Any:  # noqa: N803 - PySpark's name
        return sql(self, steering.maps.sql(sqlQuery, "spark.sql"), *args, **kwargs)

    patches.replace(SparkSession, "sql", sql_mapped)


def _file_write(steering: Steering, method: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def write(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        mapped = steering.mapped_path(path, f"DataFrameWriter.{name}({path!r})", writing=True, format=name)
        return method(self, mapped, *args, **kwargs)

    return write


def _table_write(steering: Steering, method: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``saveAsTable`` / ``insertInto``: an output, kept by its location (the catalog ends with the run)."""

    @functools.wraps(method)
    def write(self: Any, table: str, *args: Any, **kwargs: Any) -> Any:
        result = method(self, table, *args, **kwargs)
        if steering.record is not None:
            location = table_location(self._spark, table)
            steering.record.tables.setdefault(table, location or "")
            steering.record.wrote(f"table:{table}", location or table, "table", steering.query)
        return result

    return write


def table_location(spark: Any, table: str) -> str | None:
    """Where a catalog table's files are (``DESCRIBE TABLE EXTENDED``'s Location), None when it has none."""
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").collect()
    found = next((row for row in rows if str(row[0]).strip() == "Location"), None)
    return str(found[1]).strip() if found is not None else None


def _file_read(steering: Steering, method: Callable[..., Any], name: str) -> Callable[..., Any]:
    def each(path: Any) -> Any:
        if isinstance(path, (list, tuple)):
            return [steering.mapped_path(item, f"read.{name}(path)", writing=False) for item in path]
        return steering.mapped_path(path, f"read.{name}({path!r})", writing=False)

    @functools.wraps(method)
    def read(self: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        if name == "parquet":  # parquet(*paths): every positional argument is a path
            return method(self, each(path), *(each(more) for more in args), **kwargs)
        return method(self, each(path), *args, **kwargs)

    return read


def _patch_delta(patches: Patches, steering: Steering) -> None:
    from delta.tables import DeltaTable, DeltaTableBuilder

    for_path = DeltaTable.forPath.__func__  # type: ignore[attr-defined]

    def forpath(cls: Any, sparkSession: Any, path: str, *args: Any, **kwargs: Any) -> Any:  # noqa: N803
        found = steering.maps._map_for(path) if isinstance(path, str) else None
        shared = found is not None and found.input
        mapped = steering.mapped_path(
            path, f"DeltaTable.forPath({path!r})", writing=not shared, format=None if shared else "delta"
        )
        return for_path(cls, sparkSession, mapped, *args, **kwargs)

    patches.replace(DeltaTable, "forPath", classmethod(forpath))
    location = DeltaTableBuilder.location

    @functools.wraps(location)
    def located(self: Any, location_: str) -> Any:
        mapped = steering.mapped_path(
            location_, f"DeltaTableBuilder.location({location_!r})", writing=True, format="delta"
        )
        return location(self, mapped)

    patches.replace(DeltaTableBuilder, "location", located)


def _database_of(url: str) -> str:
    """A JDBC URL or conninfo's database as ``postgresql://host:port/db`` (the key of an output)."""
    text = url.removeprefix("jdbc:")
    return text.split("?", 1)[0]


def _patch_psycopg(patches: Patches, steering: Steering, psycopg: Any) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    connect = psycopg.Connection.connect.__func__

    def connected(cls: Any, conninfo: str = "", **kwargs: Any) -> Any:
        settings = {key: str(value) for key, value in conninfo_to_dict(conninfo, **kwargs).items() if value is not None}
        mapped = steering.maps.database(settings, "psycopg.connect")
        named = f"postgresql://{settings.get('host', '')}:{settings.get('port', '5432')}/{settings.get('dbname', '')}"
        where = f"postgresql://{mapped.get('host')}:{mapped.get('port', '5432')}/{mapped.get('dbname', '')}"
        steering.wrote(named, where, "postgresql")
        return connect(cls, make_conninfo(**mapped))

    patches.replace(psycopg.Connection, "connect", classmethod(connected))
    patches.replace(psycopg, "connect", psycopg.Connection.connect)


def _patch_confluent(patches: Patches, steering: Steering, confluent_kafka: Any) -> None:
    producer_class, consumer_class = confluent_kafka.Producer, confluent_kafka.Consumer

    def mapped_config(config: dict[str, Any], what: str) -> dict[str, Any]:
        config = dict(config)
        if "bootstrap.servers" in config:
            config["bootstrap.servers"] = steering.maps.servers(
                config["bootstrap.servers"], f"{what} bootstrap.servers"
            )
        if steering.maps.kafka is not None:  # a local broker speaks plaintext: production's security settings go
            config = {key: value for key, value in config.items() if not key.startswith(("security.", "sasl.", "ssl."))}
        return config

    class Producer(producer_class):  # type: ignore[misc, valid-type]
        def __init__(self, config: dict[str, Any], **kwargs: Any) -> None:
            super().__init__(mapped_config(config, "Producer"), **kwargs)

        def produce(self, topic: str, *args: Any, **kwargs: Any) -> Any:
            mapped = steering.maps.topic(topic, writing=True)
            steering.wrote(f"kafka:{topic}", mapped, "kafka")
            return super().produce(mapped, *args, **kwargs)

    class Consumer(consumer_class):  # type: ignore[misc, valid-type]
        def __init__(self, config: dict[str, Any], **kwargs: Any) -> None:
            super().__init__(mapped_config(config, "Consumer"), **kwargs)

        def subscribe(self, topics: list[str], *args: Any, **kwargs: Any) -> Any:
            return super().subscribe([steering.maps.topic(t, writing=False) for t in topics], *args, **kwargs)

    patches.replace(confluent_kafka, "Producer", Producer)
    patches.replace(confluent_kafka, "Consumer", Consumer)


def in_worker(
    maps: AddressMaps, folder: str | None, query: str | None, function: Callable[..., Any], *args: Any
) -> Any:
    """Run ``function`` in a Python worker with the run's maps in place there (installed once per worker); what it
    writes is noted in ``folder`` as an output of ``query``."""
    global _STEERING
    if _STEERING is not None and _STEERING.record is None:
        _STEERING.folder, _STEERING.query = folder, query
    if _STEERING is None or _STEERING.maps != maps:
        _STEERING = Steering(maps, folder=folder, query=query)
        patches = Patches()
        with contextlib.suppress(ImportError):
            import psycopg

            _patch_psycopg(patches, _STEERING, psycopg)
        with contextlib.suppress(ImportError):
            import confluent_kafka

            _patch_confluent(patches, _STEERING, confluent_kafka)
    return function(*args)


def _patch_tasks(patches: Patches, steering: Steering) -> None:
    """Functions a job runs in tasks (``foreachPartition``, ``foreach``) run with the maps in their worker."""
    from pyspark import RDD

    each_partition, each_row = RDD.foreachPartition, RDD.foreach

    def partitions(self: Any, f: Callable[..., Any]) -> Any:
        return each_partition(self, functools.partial(in_worker, steering.maps, steering.folder, steering.query, f))

    def rows(self: Any, f: Callable[..., Any]) -> Any:
        return each_row(self, functools.partial(in_worker, steering.maps, steering.folder, steering.query, f))

    patches.replace(RDD, "foreachPartition", partitions)
    patches.replace(RDD, "foreach", rows)


def is_file_format(format: str) -> bool:
    """Whether Spark's sink of ``format`` writes files into a folder with a ``_spark_metadata`` log.

    >>> is_file_format("parquet"), is_file_format("delta"), is_file_format("kafka")
    (True, False, False)
    """
    return format in FILE_FORMATS


def local_folder(location: str) -> str | None:
    """The local folder of a location (None on another store).

    >>> local_folder("/tmp/w/orders"), local_folder("file:/tmp/w/orders"), local_folder("s3a://b/orders")
    ('/tmp/w/orders', '/tmp/w/orders', None)
    """
    if location.startswith("file:"):  # file:/x too, which has no "://" for scheme_of
        return file_path(location)
    return location if scheme_of(location) is None else None
