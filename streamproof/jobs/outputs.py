"""What a run of a job left in the places it wrote, read as rows: by Spark, and again without Spark.

Each output of a job's record (:class:`~streamproof.jobs.record.Output`) is read in one or more *readings*, each a
list of rows (dicts), which :mod:`streamproof.jobs.compare` counts against the twin's:

* a Delta table: its rows at its latest version (Spark: ``format("delta")``; without Spark: delta-rs);
* a folder of a file sink (Parquet, JSON, CSV, ORC, text): two readings, as its readers differ: ``spark`` honours the
  sink's ``_spark_metadata`` log (the files of committed batches only), ``files`` reads every data file in the folder,
  as pyarrow, Hive or Trino do (Spark too, given the files); without Spark both are read with pyarrow;
* a Kafka topic: key and value of every record, read committed (Spark's Kafka source; confluent-kafka);
* a PostgreSQL database: every table of the ``public`` schema, each a reading of its own (Spark's JDBC source;
  psycopg).

Example::

    >>> readings_of(Output("/tmp/out", "parquet"))
    ['spark', 'files']
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from streamproof.infra.postgres import PG_DEFAULT_PASSWORD, PG_PASSWORD_ENV, PG_USER
from streamproof.jobs.inside import FILE_FORMATS, local_folder
from streamproof.jobs.maps import AddressMaps, scheme_of
from streamproof.jobs.record import Output

Rows = list[dict[str, Any]]
READING_NAMES = {
    "spark": "as Spark reads it (honouring _spark_metadata)",
    "files": "its files (as pyarrow, Hive or Trino read the folder)",
    "rows": "its rows",
}


def readings_of(output: Output) -> list[str]:
    """The readings of an output (see the module); a database's are its tables, known when it is read."""
    if output.format in FILE_FORMATS:
        return ["spark", "files"]
    return ["rows"]


def _is_delta(location: str) -> bool:
    folder = local_folder(location)
    return folder is None or (Path(folder) / "_delta_log").is_dir()


def data_files(folder: str, format: str) -> list[str]:
    """The data files of a folder (partition folders included), in name order: what a reader of the files sees."""
    found = []
    for root, folders, names in os.walk(folder):
        folders[:] = sorted(name for name in folders if not name.startswith(("_", ".")))
        for name in sorted(names):
            if not name.startswith(("_", ".")) and not name.endswith(".crc"):
                found.append(os.path.join(root, name))
    return found


def committed_files(folder: str) -> list[str]:
    """The files Spark's file sink log (``_spark_metadata``) lists as committed (added and not deleted)."""
    log = Path(folder) / "_spark_metadata"
    if not log.is_dir():
        return []
    entries = sorted(
        (path for path in log.iterdir() if path.name.split(".")[0].isdigit()),
        key=lambda path: int(path.name.split(".")[0]),
    )
    compacts = [path for path in entries if path.name.endswith(".compact")]
    start = int(compacts[-1].name.split(".")[0]) if compacts else -1
    added: dict[str, bool] = {}
    for path in entries:
        number = int(path.name.split(".")[0])
        if number < start or (number == start and not path.name.endswith(".compact")):
            continue
        for line in path.read_text().splitlines()[1:]:
            if line.strip():
                entry = json.loads(line)
                added[urlsplit(entry["path"]).path] = entry.get("action", "add") != "delete"
    return sorted(name for name, present in added.items() if present)


class SparkReader:
    """The Spark checker's reading of outputs, in a session of the checker's own (see the module): ``spark`` is the
    session, or what makes it when the first output is read (a proof whose twin fails never starts it)."""

    def __init__(self, spark: Any, maps: AddressMaps) -> None:
        self._spark = spark
        self.maps = maps

    @property
    def spark(self) -> Any:
        if callable(self._spark):
            self._spark = self._spark()
        return self._spark

    def read(self, output: Output) -> dict[str, Rows]:
        if output.format == "postgresql":
            return self._database(output.location)
        if output.format == "kafka":
            return {"rows": self._topic(output.location)}
        location = output.location
        folder = local_folder(location)
        if folder is not None and not Path(folder).exists():
            return {name: [] for name in readings_of(output)}
        if output.format in FILE_FORMATS:
            reader = self.spark.read.format(output.format)
            files = data_files(folder, output.format) if folder is not None else []
            by_files = reader.option("basePath", location).load(files) if files else None
            return {"spark": _collect(reader.load(location)), "files": _collect(by_files) if by_files else []}
        kind = "delta" if output.format in ("delta", "table") and _is_delta(location) else "parquet"
        return {"rows": _collect(self.spark.read.format(kind).load(location))}

    def _database(self, location: str) -> dict[str, Rows]:
        """Every table of the database's ``public`` schema, through Spark's JDBC source (the PostgreSQL driver is in
        the jars); the independent checker reads them with psycopg."""
        settings = database_settings(location, self.maps)
        url = f"jdbc:postgresql://{settings['host']}:{settings['port']}/{settings['dbname']}"

        def jdbc(table: str) -> Any:
            return (
                self.spark.read.format("jdbc")
                .option("url", url)
                .option("driver", "org.postgresql.Driver")  # spark.jars are not DriverManager's: named, it loads
                .option("dbtable", table)
                .option("user", settings["user"])
                .option("password", settings["password"])
                .load()
            )

        try:
            names = jdbc("(SELECT table_name FROM information_schema.tables WHERE table_schema = 'public') t")
            tables = sorted(str(row[0]) for row in names.collect())
        except Exception as error:  # noqa: BLE001 - a sandbox whose database was never made holds nothing
            if "does not exist" in str(error):
                return {}
            raise
        return {f"table {table}": _collect(jdbc(f'public."{table}"')) for table in tables}

    def _topic(self, topic: str) -> Rows:
        frame = (
            self.spark.read.format("kafka")
            .option("kafka.bootstrap.servers", self.maps.kafka or "127.0.0.1:9092")
            .option("subscribe", topic)
            .option("kafka.isolation.level", "read_committed")
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
        )
        return _collect(frame)


def _collect(frame: Any) -> Rows:
    return [row.asDict(recursive=True) for row in frame.collect()]


class IndependentReader:
    """The same readings without Spark: delta-rs, pyarrow, confluent-kafka, psycopg (docs/jobs.md)."""

    def __init__(self, maps: AddressMaps) -> None:
        self.maps = maps

    def read(self, output: Output) -> dict[str, Rows]:
        if output.format == "postgresql":
            return read_database(output.location, self.maps)
        if output.format == "kafka":
            return {"rows": self._topic(output.location)}
        folder = local_folder(output.location)
        if folder is None:
            raise NotImplementedError(f"{output.location}: the independent checker reads local folders only")
        if not Path(folder).exists():
            return {name: [] for name in readings_of(output)}
        if output.format in FILE_FORMATS:
            read = _file_reader(output.format)
            return {
                "spark": [row for name in committed_files(folder) for row in read(name, folder)],
                "files": [row for name in data_files(folder, output.format) for row in read(name, folder)],
            }
        if _is_delta(folder):
            from deltalake import DeltaTable

            return {"rows": DeltaTable(folder).to_pyarrow_table().to_pylist()}
        return {
            "rows": [row for name in data_files(folder, "parquet") for row in _file_reader("parquet")(name, folder)]
        }

    def _topic(self, topic: str) -> Rows:
        from confluent_kafka import Consumer, TopicPartition

        servers = self.maps.kafka or "127.0.0.1:9092"
        consumer = Consumer(
            {
                "bootstrap.servers": servers,
                "group.id": "streamproof-job-check",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "log_level": 2,
            }
        )
        rows: Rows = []
        try:
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None:
                return rows
            for partition in metadata.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                if high <= low:
                    continue
                consumer.assign([TopicPartition(topic, partition, low)])
                while True:
                    message = consumer.poll(5.0)
                    if message is None:
                        break
                    if message.error() is None:
                        rows.append({"key": _text(message.key()), "value": _text(message.value())})
                    offset = message.offset()
                    if offset is not None and offset >= high - 1:
                        break
        finally:
            consumer.close()
        return rows


def _text(value: bytes | None) -> str | None:
    return value.decode("utf-8", errors="replace") if value is not None else None


def _file_reader(format: str) -> Callable[[str, str], Rows]:
    def read(name: str, folder: str) -> Rows:
        partition = _partition_values(name, folder)
        if format == "parquet":
            import pyarrow.parquet as pq

            rows = pq.read_table(name).to_pylist()
        elif format == "orc":
            import pyarrow.orc as orc

            rows = orc.read_table(name).to_pylist()
        elif format == "json":
            rows = [json.loads(line) for line in Path(name).read_text().splitlines() if line.strip()]
        else:
            rows = [{"value": line} for line in Path(name).read_text().splitlines()]
        return [{**row, **partition} for row in rows]

    return read


def _partition_values(name: str, folder: str) -> dict[str, str]:
    relative = os.path.relpath(os.path.dirname(name), folder)
    return dict(part.split("=", 1) for part in relative.split(os.sep) if "=" in part)


def database_settings(location: str, maps: AddressMaps) -> dict[str, Any]:
    """How to reach a database output (``postgresql://host:port/db``): its credentials are the map target's, else
    the local server's (as the run used them)."""
    parts = urlsplit(location)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 5432,
        "dbname": parts.path.strip("/"),
        "user": parts.username or PG_USER,
        "password": _password_for(parts.hostname or "127.0.0.1", maps),
    }


def read_database(location: str, maps: AddressMaps) -> dict[str, Rows]:
    """Every table of the database's ``public`` schema with psycopg, each a reading (``table <name>``)."""
    import psycopg

    settings = {**database_settings(location, maps), "connect_timeout": 10}
    readings: dict[str, Rows] = {}
    try:
        connection = psycopg.connect(**settings)
    except psycopg.OperationalError as error:
        if "does not exist" in str(error):
            return readings
        raise
    with connection:
        tables = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name"
        ).fetchall()
        for (table,) in tables:
            cursor = connection.execute(f'SELECT * FROM public."{table}"')
            names = [column.name for column in cursor.description or []]
            readings[f"table {table}"] = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return readings


def _password_for(host: str, maps: AddressMaps) -> str:
    for path in maps.paths:
        if scheme_of(path.target) in ("postgresql", "postgres", "jdbc:postgresql"):
            target = urlsplit(path.target.removeprefix("jdbc:"))
            if (target.hostname or "") == host and target.password:
                return target.password
    return os.environ.get(PG_PASSWORD_ENV, PG_DEFAULT_PASSWORD)
