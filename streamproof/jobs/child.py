"""One run of a job file under streamproof: ``streamproof run JOB.py``, the process the proof starts and kills.

The job runs as ``spark-submit`` would run it: ``runpy`` executes the file as ``__main__``, with ``sys.argv`` the job's
arguments and the job's folder first on ``sys.path``. Before it runs, the run starts the session the job's
``SparkSession.builder.getOrCreate()`` will get (the cached jars, the checkpoint manager that shows a batch's moments,
a warehouse of its own) and patches PySpark (:mod:`streamproof.jobs.patches`, :mod:`streamproof.jobs.inside`). What
the job chose is made safe for a proof, each change printed once and kept in the record:

* every production address through the maps (:mod:`streamproof.jobs.maps`);
* a ``processingTime`` or ``once`` trigger, or none, runs as ``availableNow``: a run drains what the topic holds;
* ``startingOffsets = latest`` (Spark's default) reads a fresh proof topic from its start;
* ``maxOffsetsPerTrigger`` is set where the job sets none, and lowered where the topic holds too few records for
  three batches at the job's own size: a proof needs batches to crash between;
* ``awaitAnyTermination()`` waits for every query to drain.

The job's own failure (a syntax error, an import, an exception before or inside a batch) ends the run with one line
naming the job's file and line, its traceback in a file (:class:`~streamproof.jobs.scan.JobError`); a job that started
no query says so. Neither is a proof result.

Example::

    $ streamproof run examples/jobs/orders_bronze.py --kafka 127.0.0.1:9092 --map s3://prod/=.streamproof/prod/
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import runpy
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql.classic.dataframe import DataFrame

from streamproof.config import KafkaSource, SparkSettings
from streamproof.errors import ConfigError
from streamproof.faults import points as faults
from streamproof.faults.in_tasks import fault_folder
from streamproof.harness.cluster import event_log_conf
from streamproof.jobs import inside
from streamproof.jobs.inside import local_folder
from streamproof.jobs.maps import AddressMaps, refusals
from streamproof.jobs.moments import CRASH_QUERY_ENV, MANAGER_CLASS, MANAGER_CONF, Moments, holding_conf
from streamproof.jobs.patches import Patches, install_stream_patches
from streamproof.jobs.plan import plan_facts
from streamproof.jobs.recompute import BatchWriter, batch_options
from streamproof.jobs.record import RECORD_FILE, JobRecord, QueryRecord
from streamproof.jobs.scan import JobError, job_digest, one_line, where_in_job
from streamproof.jobs.yours import YourWrite
from streamproof.jvm.jars import cached_jars
from streamproof.jvm.session import NO_DATA_BATCHES, build_session
from streamproof.kafka_client import ensure_topic, require_topic
from streamproof.pipeline.events import STARTED, BatchCommitted, Event, Notice
from streamproof.your_code.steps import watch_durable_calls

PROOF_BATCHES = 3  # batches a run makes of the topic when the job sets no size: the crash lands in the second
CHANGED = "changed"  # a notice: one of the job's own choices changed for the run
STATIC_SETTINGS = ("spark.master", "spark.jars", "spark.driver.", "spark.executor.", "spark.submit.", "spark.app.name")
SECURITY_OPTIONS = ("kafka.security.", "kafka.sasl.", "kafka.ssl.")


class JobRun:
    """One run of ``job`` (see the module): the session, the patches, the record, the crash armed, the events."""

    def __init__(
        self,
        job: Path,
        argv: list[str],
        maps: AddressMaps,
        state_dir: Path,
        *,
        master: str | None = None,
        publish: Callable[[Event], None] | None = None,
        recompute: dict[str, dict[str, int]] | None = None,
    ) -> None:
        self.job = job.resolve()
        self.argv = argv
        self.maps = maps
        self.state_dir = state_dir
        self.master = master
        self._publish = publish
        state_dir.mkdir(parents=True, exist_ok=True)
        earlier = JobRecord.read(state_dir)
        self.record = JobRecord(
            job=str(job), digest=job_digest(job), argv=argv, maps=maps.describe(), path=str(state_dir / RECORD_FILE)
        )
        self.record.tables = dict(earlier.tables) if earlier is not None else {}  # a restart finds the job's tables
        self.patches = Patches()
        self.spark: Any = None
        self.moments: Moments | None = None
        self.sources: list[dict[str, Any]] = []
        self.published: dict[str, int] = {}  # query id -> the last batch whose progress was published
        self.listener: Any = None
        self.recompute = recompute  # the topics' ends a recomputation reads to (streamproof.jobs.recompute)
        self.yours = YourWrite(self)

    def publish(self, event: Event) -> None:
        if self._publish is not None:
            self._publish(event)

    def changed(self, line: str) -> None:
        """One of the job's own choices changed for this run: recorded, and said once (a ``changed`` notice)."""
        if line not in self.record.overrides:
            self.record.changed(line)
            self.publish(Notice(self.job.stem, CHANGED, f"changed: {line}"))

    # --- the session -------------------------------------------------------------------------------------------------

    def start_session(self) -> Any:
        """The session the job's ``getOrCreate()`` gets: streamproof's (jars, checkpoint manager, a warehouse here)."""
        conf = {
            MANAGER_CONF: MANAGER_CLASS,
            "spark.sql.warehouse.dir": str(self.state_dir / "warehouse"),
            NO_DATA_BATCHES: "true",  # Spark's own default: a job's windows close as they would in production
        }
        if self.master and not self.master.startswith("local"):  # the evidence of faults of the machines
            conf.update(event_log_conf(Path(fault_folder()).parent / "spark-events"))
            conf.update(holding_conf(cached_jars("spark"), fault_folder()))
        settings = SparkSettings(conf=conf, **({"master": self.master} if self.master else {}))
        self.spark = build_session(settings, app_name=f"streamproof-job:{self.job.stem}")
        for name, location in self.record.tables.items():  # the catalog lives as long as the run: made again
            database = name.rsplit(".", 1)[0] if "." in name else None
            if database:
                self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
            if location:
                self.spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING delta LOCATION '{location}'")
        self.moments = Moments(self.spark, fault_folder(), os.environ.get(CRASH_QUERY_ENV))
        self.listener = _Progress(self)
        self.spark.streams.addListener(self.listener)
        return self.spark

    def _last_events(self, timeout_s: float = 10.0) -> None:
        """Spark posts a batch's progress to listeners after the query moved on: wait (bounded) until the last batch
        of every query was published, then stop listening, so that the run's end loses no batch and no callback of
        the listener bus meets a closed gateway."""
        deadline = time.monotonic() + timeout_s
        for query in self.record.queries:
            if query.query_id is None:
                continue
            while time.monotonic() < deadline and self.published.get(query.query_id, -1) < self._last_batch(query):
                time.sleep(0.05)
        with contextlib.suppress(Exception):
            self.spark.streams.removeListener(self.listener)

    def _last_batch(self, query: QueryRecord) -> int:
        folder = local_folder(query.checkpoint) if query.checkpoint else None
        commits = Path(folder) / "commits" if folder else None
        if commits is None or not commits.is_dir():
            return -1
        return max((int(name.name) for name in commits.iterdir() if name.name.isdigit()), default=-1)

    def session_for_job(self, builder: Any, get_or_create: Callable[[], Any]) -> Any:
        """``getOrCreate()``: the run's session with the job's runtime settings; the others listed as not applied."""
        options = builder._options
        if "spark.remote" in options or str(options.get("spark.api.mode", "")).lower() == "connect":
            raise ConfigError(
                "the job asks for Spark Connect (spark.remote / spark.api.mode=connect): its code would run in a "
                "server's worker that streamproof cannot crash or watch; build the session without it"
            )
        for key in list(options):
            value = options[key]
            if key == "spark.sql.streaming.checkpointLocation":
                options[key] = self.path(str(value), "spark.sql.streaming.checkpointLocation", writing=True)
            elif key.startswith(STATIC_SETTINGS) or key in (MANAGER_CONF, "spark.sql.warehouse.dir"):
                line = f"{key}={value}"
                if line not in self.record.not_applied and str(self.spark.conf.get(key, "")) != str(value):
                    self.record.not_applied.append(line)
                del options[key]
        session = get_or_create()
        self.record.save()
        return session

    # --- the source --------------------------------------------------------------------------------------------------

    def path(self, value: Any, where: str, *, writing: bool) -> Any:
        return self.maps.path(value, where, writing=writing) if isinstance(value, str) else value

    def reader_option(self, state: dict[str, Any], key: str, value: Any) -> Any:
        name = key.lower()
        if not isinstance(value, str):
            return value
        if name == "kafka.bootstrap.servers":
            return self.maps.servers(value, f"readStream.option({key!r})")
        if name == "subscribe":
            return self.maps.topics_of(value, writing=False)
        if name == "assign" and value.lstrip().startswith("{"):
            return json.dumps({self.maps.topic(t, writing=False): p for t, p in json.loads(value).items()})
        if name == "path":
            return self.path(value, "readStream.option('path')", writing=False)
        if name == "kafka.security.protocol" and self.maps.kafka is not None:
            self.changed(f"readStream {key}={value} -> PLAINTEXT (the local broker of --kafka)")
            return "PLAINTEXT"
        return value

    def before_load(self, reader: Any, state: dict[str, Any], set_option: Callable[[str, Any], Any]) -> Any:
        """At ``load()`` of a Kafka source: where it starts and how big its batches are (see the module); in a
        recomputation, the batch DataFrame of the records the twin read, which ``load()`` returns instead."""
        options, written = state["options"], state["written"]
        self.sources.append({"format": state["format"], "options": dict(written)})
        if state["format"] != "kafka":
            return None
        if self.recompute is not None:
            return self.spark.read.format("kafka").options(**batch_options(options, self.recompute)).load()
        if written.get("startingoffsets", "latest") == "latest":
            was = (
                f"startingOffsets={written['startingoffsets']}"
                if "startingoffsets" in written
                else "no startingOffsets (latest)"
            )
            self.changed(f"{was} -> earliest: a fresh proof topic is read from its start")
            set_option("startingOffsets", "earliest")
        topics = [t for t in str(options.get("subscribe", "")).split(",") if t]
        servers = options.get("kafka.bootstrap.servers")
        if not topics or servers is None:
            return None
        marks: list[tuple[int, int]] = []
        for topic in topics:
            found = require_topic(KafkaSource(kind="kafka", topic=topic, bootstrap_servers=servers))
            self.record.topics[topic] = {str(partition): high for partition, (_, high) in found.items()}
            marks += found.values()
        held = sum(high - low for low, high in marks)
        if held == 0:
            raise ConfigError(
                f"topic {', '.join(topics)} on {servers} holds no records: fill it first (e.g. `streamproof generate "
                f"--topic {topics[0]} --count 20000`), a proof needs batches to crash between"
            )
        size = math.ceil(held / PROOF_BATCHES) + len(marks)  # Spark rounds each partition's share down
        job_size = written.get("maxoffsetspertrigger")
        if job_size is None:
            self.changed(f"no maxOffsetsPerTrigger -> {size}: the topic's {held:,} records in {PROOF_BATCHES} batches")
        elif int(job_size) * 3 > held:
            self.changed(
                f"maxOffsetsPerTrigger={job_size} -> {size}: the topic holds {held:,} records, too few for 3 batches "
                f"at {job_size}"
            )
        else:
            return None
        set_option("maxOffsetsPerTrigger", str(size))
        return None

    # --- the sink ----------------------------------------------------------------------------------------------------

    def writer_option(self, state: dict[str, Any], key: str, value: Any) -> Any:
        name = key.lower()
        if not isinstance(value, str):
            return value
        if name == "checkpointlocation":
            return self.path(value, "writeStream.option('checkpointLocation')", writing=True)
        if name == "path":
            return self.path(value, "writeStream.option('path')", writing=True)
        if name == "kafka.bootstrap.servers":
            return self.maps.servers(value, f"writeStream.option({key!r})")
        if name == "topic":
            return self.maps.topic(value, writing=True)
        if name == "kafka.security.protocol" and self.maps.kafka is not None:
            self.changed(f"writeStream {key}={value} -> PLAINTEXT (the local broker of --kafka)")
            return "PLAINTEXT"
        return value

    def foreach_batch(self, writer: Any, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.yours.wrapped(writer, function, foreach=False)

    def foreach(self, writer: Any, written: Any) -> Callable[..., Any]:
        self.changed(
            "foreach(writer): run through each batch's partitions as Spark's foreach runs it (open, process, close), "
            "from a foreachBatch of streamproof's, so its commits are moments a crash lands at"
        )
        return self.yours.wrapped(writer, written, foreach=True)

    def before_start(
        self, writer: Any, state: dict[str, Any], path: str | None, table: str | None, set_trigger: Callable[..., Any]
    ) -> QueryRecord:
        """What the query is, made safe and recorded, and the crash armed in it, before it starts."""
        order = len(self.record.queries) + 1
        label = state["query_name"] or f"query {order}"
        sink = state["format"] or str(self.spark.conf.get("spark.sql.sources.default", "parquet"))
        written, options = state["written"], state["options"]
        address = table or path or written.get("path") or written.get("topic")
        location = self.path(path, "writeStream.start(path)", writing=True) if path else options.get("path")
        if table is not None:
            location = self._table_location(table, options.get("path"))
        if sink == "kafka" and "topic" not in options:
            raise ConfigError(
                f"{label}: a Kafka sink without option('topic', ...) writes to the topics its rows name; streamproof "
                "maps only named topics: set the topic option"
            )
        if sink == "kafka" and self.maps.sandbox is not None and options.get("kafka.bootstrap.servers"):
            # A sandbox's topic is new, and a broker that creates no topic on a first write (streamproof's own, as
            # production brokers often are) fails the write after a minute: made here, with one partition (the
            # rows are compared as multisets, whatever partition they went to).
            ensure_topic(options["kafka.bootstrap.servers"], options["topic"], 1)
        checkpoint = options.get("checkpointlocation")
        conf_root = self.spark.conf.get("spark.sql.streaming.checkpointLocation", None)
        if checkpoint is None and conf_root and state["query_name"]:
            checkpoint = f"{conf_root.rstrip('/')}/{state['query_name']}"
        trigger = state["trigger"] or "none (a batch as soon as the last ends, forever)"
        if "availableNow=True" not in trigger:
            self.changed(f"{label}: trigger {trigger} -> availableNow: a run drains what the topic holds, then stops")
        set_trigger(availableNow=True)
        query = QueryRecord(
            label=label,
            order=order,
            sink=sink,
            address=address,
            location=location if sink != "kafka" else options.get("topic"),
            checkpoint_address=written.get("checkpointlocation"),
            checkpoint=checkpoint,
            function=_name_of(state.get("function")),
            source=self.sources[-1] if self.sources else {},
            trigger=state["trigger"] or "",
            table=table,
        )
        self._read_plan(writer, query)
        state["query"] = query
        self.record.query_started(query)
        if sink not in ("foreachBatch", "foreach") and address is not None:
            self.record.wrote(address if sink != "kafka" else f"kafka:{address}", query.location or "", sink, label)
        assert self.moments is not None
        self.moments.arm(query)
        return query

    def _table_location(self, table: str, path: str | None) -> str:
        database = table.rsplit(".", 1)[0] if "." in table else None
        if database:
            self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
        known = self.record.tables.get(table)
        if known:
            return known
        if path:
            return path
        warehouse = self.spark.conf.get("spark.sql.warehouse.dir").removeprefix("file:")
        parts = table.split(".")
        return f"{warehouse}/{parts[0]}.db/{parts[1]}" if len(parts) == 2 else f"{warehouse}/{parts[0]}"

    def _read_plan(self, writer: Any, query: QueryRecord) -> None:
        try:
            facts = plan_facts(writer._df._jdf.queryExecution().analyzed().toJSON())
        except Exception as error:  # noqa: BLE001 - a plan Spark cannot render: said, and nothing left out on trust
            query.unknown.append(f"the query's plan could not be read ({type(error).__name__}): its columns unchecked")
            return
        query.left_out.update(facts.left_out)
        query.unknown.extend(facts.unknown)
        query.stateful.extend(facts.stateful)

    def after_start(self, started: Any, query: QueryRecord) -> Any:
        query.query_id, query.run_id = str(started.id), str(started.runId)
        if query.checkpoint is None:  # Spark chose it: known now, armed now (its first batch is still running)
            query.checkpoint = str(started._jsq.streamingQuery().resolvedCheckpointRoot())
            assert self.moments is not None
            self.moments.arm(query)
        if query.table is not None:  # the catalog made it: its location, to find it again after a restart
            self.record.tables[query.table] = inside.table_location(self.spark, query.table) or query.location or ""
        self.record.save()
        self.publish(Notice(self.job.stem, STARTED, f"{query.label} started (sink {query.sink}, id {query.query_id})"))
        return started

    # --- the waits ---------------------------------------------------------------------------------------------------

    def await_query(self, query: Any, wait: Callable[[], Any]) -> Any:
        return wait()

    def await_every_query(self, manager: Any) -> bool:
        self.changed("awaitAnyTermination() -> every query drains before the job goes on")
        for query in list(manager.active):
            query.awaitTermination()
        return True

    # --- the run -----------------------------------------------------------------------------------------------------

    def install(self) -> None:
        install_stream_patches(self.patches, self)
        if self.recompute is not None:
            streaming = DataFrame.writeStream
            started: list[str] = []

            def write_stream(frame: Any) -> Any:
                if frame.isStreaming:
                    return streaming.fget(frame)  # type: ignore[attr-defined]
                return BatchWriter(frame, self.state_dir, started)

            self.patches.replace(DataFrame, "writeStream", property(write_stream))
        steering = inside.Steering(self.maps, self.record, folder=str(self.state_dir))
        inside.install_inside_patches(self.patches, steering)
        watch_durable_calls()  # after the maps: a step is named by the job's own address

    def run(self) -> JobRecord:
        """Run the job once as ``__main__``; its record. The job's own failure is a :class:`JobError`."""
        faults.arm_from_environment()
        self.start_session()
        self.install()
        self.record.save()
        saved_argv, saved_path = sys.argv[:], sys.path[:]
        sys.argv = [str(self.job), *self.argv]
        sys.path.insert(0, str(self.job.parent))
        try:
            runpy.run_path(str(self.job), run_name="__main__")
        except SystemExit as stopped:
            if stopped.code not in (None, 0):
                self._failed(stopped, f"the job exited with code {stopped.code}")
        except BaseException as error:  # noqa: BLE001 - the job's own failure: reported as the job's, not ours
            self._failed(error)
        finally:
            sys.argv, sys.path = saved_argv, saved_path
            self._last_events()
            self.patches.undo()
        refused = refusals()
        if refused:  # the job may have caught it: a refusal is never swallowed
            raise ConfigError(refused[0])
        if self.record.error is not None:
            raise JobError(f"job error: {self.record.error} (traceback: {self.record.error_file})")
        if not self.record.queries and self.recompute is None:
            raise JobError(
                f"job error: {self.job} started no streaming query (no writeStream ... start() or toTable()): "
                "nothing to prove"
            )
        if job_digest(self.job) != self.record.digest:
            raise JobError(f"{self.job} changed while it ran (its sha256 differs): the proof would not be of it")
        return self.record

    def _failed(self, error: BaseException, text: str | None = None) -> None:
        if isinstance(error, ConfigError) and refusals():
            return  # a refusal of ours, raised through the job: reported as the refusal
        line = where_in_job(error, self.job) + ": " + (text or one_line(error))
        self.record.failed(line, self.traceback_file(error))

    def traceback_file(self, error: BaseException) -> str:
        folder = self.state_dir / "errors"
        folder.mkdir(exist_ok=True)
        target = folder / f"job-error-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.txt"
        target.write_text("".join(traceback.format_exception(error)))
        return str(target)


def _name_of(function: Any) -> str | None:
    if function is None:
        return None
    target = function if callable(function) and not hasattr(function, "process") else type(function)
    module = getattr(target, "__module__", "") or ""
    name = str(getattr(target, "__qualname__", repr(target)))
    return name if module in ("", "__main__") else f"{module}:{name}"


class _Progress:
    """Spark's progress of every query -> one ``batch`` event each (the harness counts and times them)."""

    def __new__(cls, run: JobRun) -> Any:
        from pyspark.sql.streaming import StreamingQueryListener

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                progress = event.progress
                query = next((q for q in run.record.queries if q.query_id == str(progress.id)), None)
                label = query.label if query is not None else str(progress.name or progress.id)
                rows = int(progress.numInputRows)
                run.published[str(progress.id)] = max(run.published.get(str(progress.id), -1), int(progress.batchId))
                run.publish(
                    BatchCommitted(
                        label,
                        int(progress.batchId),
                        rows,
                        rows,
                        0,
                        (progress.batchDuration or 0) / 1000.0,
                        None,
                        job=True,
                    )
                )

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        return Listener()
