"""What every benchmark shares: the broker, a work folder of the run, the generated events, pipeline children
(:class:`BenchChild`) and the figures of one run (:class:`PipelineRun`).

A pipeline's rate is its rows divided by the time from its ``started`` event (the query runs) to its last
committed batch: JVM start-up is excluded from throughput and reported by the recovery benchmark.

Example::

    >>> ratio(45.0, 50.0), ratio(1.0, 0.0)
    (0.9, None)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from streamproof.config import PipelineSpec, SparkSettings, dump_pipeline, load_pipeline
from streamproof.errors import PipelineError, first_line
from streamproof.faults.points import ArmedCrash, process_table, process_tree_groups
from streamproof.generator import generate
from streamproof.harness.child import PipelineChild
from streamproof.harness.matrix import isolated_sink
from streamproof.infra import PG_DEFAULT_PASSWORD, PG_PASSWORD_ENV, HdfsCluster, S3Server
from streamproof.infra.s3 import S3_BUCKET
from streamproof.jvm.session import build_session
from streamproof.kafka_client import topic_end_offsets, topic_exists
from streamproof.pipeline.events import READY, STARTED, BatchCommitted, Event
from streamproof.storage.location import Location

DEFAULT_EVENTS = 2_000_000
PIPELINES = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "pipelines"
RESULTS = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "results"
MALFORMED = 0.001
SEED = 7
Emit = Callable[[str], None]


@dataclass
class PipelineRun:
    """One pipeline child run as the benchmark saw it; times are seconds since the child was started."""

    pipeline: str
    rows_in: int = 0
    ready_at: float | None = None  # the ready event: Python up, checkpoint and sinks checked
    query_started_at: float | None = None
    # {"t", "batch", "rows", "duration_s", "phases", "queued_s"} (phases: streamproof.pipeline.phases)
    batches: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None
    peak_memory_mb: float = 0.0
    wall_s: float = 0.0

    @property
    def seconds(self) -> float:
        """Query start -> last committed batch."""
        if self.query_started_at is None or not self.batches:
            return 0.0
        return self.batches[-1]["t"] - self.query_started_at

    @property
    def rows_per_second(self) -> float:
        return self.rows_in / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_rows_per_second(self) -> float:
        """Rows/s of the batches after the first (a fresh JVM compiles its hot code during the first)."""
        later = [b for b in self.batches[1:] if b["rows"] > 0]
        seconds = sum(b["duration_s"] for b in later)
        return sum(b["rows"] for b in later) / seconds if seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "rows_in": self.rows_in,
            "seconds": round(self.seconds, 2),
            "rows_per_second": round(self.rows_per_second),
            "steady_rows_per_second": round(self.steady_rows_per_second),
            "wall_s": round(self.wall_s, 2),
            "peak_memory_mb": round(self.peak_memory_mb),
            "batches": len(self.batches),
            "batch_rows_per_second": [
                round(b["rows"] / b["duration_s"]) if b["duration_s"] else 0 for b in self.batches
            ],
            "batch_phases_s": [
                {"batch": b["batch"], "duration_s": b["duration_s"], "queued_s": b["queued_s"], **b["phases"]}
                for b in self.batches
            ],
        }


class BenchChild:
    """``streamproof run PIPELINE`` for a benchmark: a :class:`~streamproof.harness.child.PipelineChild` whose
    events make a :class:`PipelineRun`, and whose process tree's peak memory is sampled while it runs."""

    def __init__(
        self,
        pipeline_file: Path,
        log_dir: Path,
        emit: Emit,
        *,
        available_now: bool = True,
        crash: ArmedCrash | None = None,
        standby: bool = False,
        warm_up: bool = False,
    ) -> None:
        self.emit = emit
        role = "-standby" if standby else ""
        self.child = PipelineChild(
            pipeline_file,
            log_dir,
            name=f"{pipeline_file.parent.name}{role}-{time.strftime('%H%M%S')}",
            available_now=available_now,
            jit="tiered",  # what `streamproof run` uses: the figures users get
            on_event=self._show,
            crash=crash,
            standby=standby,
            warm_up=warm_up,
        )
        self.name = pipeline_file.parent.name
        self.peak_memory_mb = 0.0
        threading.Thread(target=self._sample_memory, daemon=True).start()

    def _show(self, event: Event) -> None:
        if isinstance(event, BatchCommitted):
            self.emit("    " + event.line())

    def _sample_memory(self) -> None:
        while self.child.process.poll() is None:
            total = _groups_pss_kb(set(process_tree_groups(self.child.pid)))
            self.peak_memory_mb = max(self.peak_memory_mb, total / 1024)
            time.sleep(0.5)

    @property
    def run(self) -> PipelineRun:
        """The run's figures so far."""
        started = self.child.started_at
        batches: list[dict[str, Any]] = [
            {
                "t": at - started,
                "batch": batch.batch_id,
                "rows": batch.rows_in,
                "duration_s": batch.duration_s,
                "phases": batch.phases,
                "queued_s": batch.queued_s,
            }
            for at, batch in self.child.batches()
        ]
        ready, query = self.child.notice_at(READY), self.child.notice_at(STARTED)
        return PipelineRun(
            self.name,
            rows_in=sum(int(b["rows"]) for b in batches),
            ready_at=None if ready is None else ready - started,
            query_started_at=None if query is None else query - started,
            batches=batches,
            exit_code=self.child.process.returncode,
            peak_memory_mb=self.peak_memory_mb,
            wall_s=time.monotonic() - started,
        )

    @property
    def started(self) -> float:
        """When the child was started (monotonic)."""
        return self.child.started_at

    @property
    def running(self) -> bool:
        return self.child.process.poll() is None

    def batches_committed(self) -> int:
        return len(self.child.batches())

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        self.child.wait_for(condition, timeout_s, what)

    def wait_for_batches(self, count: int, timeout_s: float) -> None:
        self.wait_for(lambda: self.batches_committed() >= count, timeout_s, f"{count} committed batches")

    def wait(self, timeout_s: float) -> PipelineRun:
        """Wait for the child to exit; a non-zero exit is an error (its log is named)."""
        code = self.child.wait(timeout_s)
        run = self.run
        self.child.close()
        if code != 0:
            raise PipelineError(f"pipeline exited with code {code}; log: {self.child.log_path}")
        return run

    def stop(self, timeout_s: float = 120) -> PipelineRun:
        """SIGTERM: the pipeline finishes its batch in flight and exits 0."""
        self.child.terminate()
        return self.wait(timeout_s)

    def kill(self) -> float:
        """SIGKILL the child's whole process tree; returns the moment of the kill (monotonic)."""
        at = self.child.kill_tree()
        self.child.close()
        return at


def _groups_pss_kb(groups: set[int]) -> int:
    """Proportional set size (kB) of the processes in ``groups``: shared pages are split among the processes
    sharing them, so a short-lived fork of the JVM does not count its heap twice (RSS would)."""
    total = 0
    for info in process_table().values():
        if info.group not in groups:
            continue
        try:
            rollup = Path(f"/proc/{info.pid}/smaps_rollup").read_text()
        except OSError:
            continue
        match = re.search(r"^Pss:\s+(\d+) kB", rollup, re.MULTILINE)
        total += int(match.group(1)) if match else 0
    return total


@dataclass
class Bench:
    """What every benchmark shares: the broker, a work folder of this run, the events, the bench's Spark."""

    bootstrap: str
    workdir: Path
    events: int
    emit: Emit = print
    _spark: SparkSession | None = None

    def spark(self) -> SparkSession:
        """The bench's own session (baselines and latency analysis), built on first use."""
        if self._spark is None:
            self._spark = build_session(SparkSettings(driver_memory="4g"), app_name="streamproof-bench")
        return self._spark

    def topic(self, events: int, malformed: float = MALFORMED) -> str:
        """A 4-partition topic holding exactly ``events`` generated orders, ``malformed`` of them malformed (reused
        when it already does)."""
        topic = f"bench-orders-{events}-s{SEED}" + ("" if malformed == MALFORMED else f"-m{malformed:g}")
        if topic_exists(self.bootstrap, topic):
            held = sum(topic_end_offsets(self.bootstrap, topic).values())
            if held == events:
                self.emit(f"using topic {topic}: {events:,} events already there")
                return topic
            topic = f"{topic}-{time.strftime('%H%M%S')}"
        result = generate(self.bootstrap, topic, events, partitions=4, malformed=malformed, seed=SEED)
        self.emit(
            f"produced {events:,} events into {topic} in {result.seconds:.1f} s "
            f"({result.records_per_second:,.0f} records/s, {result.malformed:,} malformed)"
        )
        return topic

    def pipeline(
        self, template: str, topic: str, name: str, *, pipeline_name: str | None = None, **changes: Any
    ) -> Path:
        """``benchmarks/pipelines/<template>.toml`` on ``topic``, with its own checkpoint, tables and sink names (and
        pipeline name, unless ``pipeline_name`` gives one: the key of its sink commits)."""
        os.environ.setdefault(PG_PASSWORD_ENV, PG_DEFAULT_PASSWORD)  # the local server's, as infra starts it
        spec = load_pipeline(PIPELINES / f"{template}.toml")
        folder = self.workdir / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        sink = isolated_sink(spec.sink, folder) if spec.sink is not None else None
        if sink is not None and hasattr(sink, "bootstrap_servers"):
            sink = sink.model_copy(update={"bootstrap_servers": self.bootstrap})
        source = spec.source.model_copy(
            update={"topic": topic, "bootstrap_servers": self.bootstrap, **changes.pop("source", {})}
        )
        updated: PipelineSpec = spec.model_copy(
            update={
                "name": pipeline_name or f"{spec.name}-{folder.parent.name}-{name}"[:100],
                "checkpoint": str(folder / "checkpoint"),
                "source": source,
                "transform": spec.transform.model_copy(update={"quarantine": str(folder / "quarantine")}),
                "sink": sink,
                **changes,
            }
        )
        pipeline_file = folder / "pipeline.toml"
        pipeline_file.write_text(dump_pipeline(updated))
        return pipeline_file

    def child(
        self,
        pipeline_file: Path,
        *,
        available_now: bool = True,
        crash: ArmedCrash | None = None,
        standby: bool = False,
        warm_up: bool = False,
    ) -> BenchChild:
        """A pipeline child of this run, its logs under the work folder (armed with ``crash``, if given; ``standby``:
        ``run --standby``; ``warm_up``: ``run --warm-up``)."""
        return BenchChild(
            pipeline_file,
            self.workdir / "logs",
            self.emit,
            available_now=available_now,
            crash=crash,
            standby=standby,
            warm_up=warm_up,
        )

    def drain(self, pipeline_file: Path, timeout_s: float = 3600) -> PipelineRun:
        """Run the pipeline to the end of its topic in a child process."""
        run = self.child(pipeline_file).wait(timeout_s)
        self.emit(
            f"  {run.pipeline}: {run.rows_in:,} rows in {run.seconds:.1f} s = {run.rows_per_second:,.0f} rows/s "
            f"({len(run.batches)} batches, peak {run.peak_memory_mb:,.0f} MB)"
        )
        return run


def relocated(
    pipeline_file: Path, storage: str | None, *, master: str | None = None, conf: dict[str, str] | None = None
) -> Path:
    """The bench pipeline file rewritten in place: its checkpoint, quarantine and sink table under ``storage`` (a URI,
    in a folder named as the pipeline's), when given; on ``master``, when given; ``conf`` added to its Spark settings.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp()) / "age-hdfs-young"
    >>> _ = folder.mkdir()
    >>> spec = load_pipeline(PIPELINES / "throughput_delta.toml")
    >>> _ = (folder / "pipeline.toml").write_text(dump_pipeline(spec))
    >>> moved = load_pipeline(relocated(folder / "pipeline.toml", "hdfs://127.0.0.1:9000/bench", conf={"k": "v"}))
    >>> moved.checkpoint, moved.spark.conf["k"]
    ('hdfs://127.0.0.1:9000/bench/age-hdfs-young/checkpoint', 'v')
    """
    spec = load_pipeline(pipeline_file)
    spark_changes: dict[str, Any] = {"conf": {**spec.spark.conf, **(conf or {})}}
    if master is not None:
        spark_changes["master"] = master
    changes: dict[str, Any] = {"spark": spec.spark.model_copy(update=spark_changes)}
    if storage is not None:
        root = Location(f"{storage}/{pipeline_file.parent.name}")
        assert spec.sink is not None, "a bench pipeline has a sink"
        changes.update(
            checkpoint=str(root / "checkpoint"),
            transform=spec.transform.model_copy(update={"quarantine": str(root / "quarantine")}),
            sink=isolated_sink(spec.sink, root),
        )
    pipeline_file.write_text(dump_pipeline(spec.model_copy(update=changes)))
    return pipeline_file


def requests_of_run(bench: Bench, s3: S3Server, before: Counter[str], batches: int) -> dict[str, int]:
    """The S3 requests of the run that just ended (``before``: the server's count when it began), by kind, with its
    ``batches`` (its start's requests included)."""
    made = s3.requests_served() - before
    counted = {kind: made.get(kind, 0) for kind in ("LIST", "GET", "PUT", "DELETE", "POST")}
    counted |= {"other": sum(made.values()) - sum(counted.values()), "batches": batches}
    bench.emit(f"  S3 requests of the run: {json.dumps(counted)}")
    return counted


def stores_running(bench: Bench, state_dir: Path, folder: str) -> dict[str, tuple[Location, S3Server | None]]:
    """The distributed stores a bench measures on beside the local disk, those whose servers run: HDFS with a live
    DataNode (``streamproof infra up --hdfs``) and S3 (``infra up --s3``), each with this bench's folder there named
    ``folder`` and its S3 server (None for HDFS). The bench's own session is pointed at S3 (it writes and deletes
    there); a store not running is said in one line.

    >>> stores_running(bench, Path(".streamproof"), "age")                                   # doctest: +SKIP
    {'s3': (Location('s3a://streamproof/bench/20261127T025925Z/age'), S3Server(...))}
    """
    hdfs, s3 = HdfsCluster(state_dir), S3Server(state_dir)
    stores: dict[str, tuple[Location, S3Server | None]] = {}
    if hdfs.running() and hdfs.live_datanodes() >= 1:
        stores["hdfs"] = (Location(f"{hdfs.uri}/bench/{bench.workdir.name}/{folder}"), None)
    else:
        bench.emit("HDFS is not running with a live DataNode (`streamproof infra up --hdfs`): not measured on HDFS")
    if s3.running():
        stores["s3"] = (Location(f"s3a://{S3_BUCKET}/bench/{bench.workdir.name}/{folder}"), s3)
        s3.point_session_at(bench.spark())
    else:
        bench.emit("S3 is not running (`streamproof infra up --s3`): not measured on S3")
    return stores


def delete_quietly(bench: Bench, folder: Location) -> None:
    """Delete a bench's folder on distributed storage after its measurement; a failure is printed, not raised, so
    that it does not hide the measurement's own error (or its results)."""
    try:
        bench.spark()  # HDFS is reached through a Spark session's JVM
        folder.delete(recursive=True)
    except Exception as error:  # noqa: BLE001 - cleaning up: say it and go on
        bench.emit(f"could not delete {folder}: {first_line(error) or type(error).__name__}")


def phases_line(batch: dict[str, Any]) -> str:
    """One batch's breakdown for the bench's output (streamproof.pipeline.phases), seconds.

    >>> phases_line({"batch": 3, "duration_s": 2.5, "queued_s": None, "phases": {"plan": 0.1, "read_parse": 1.4}})
    'batch 3, 2.50 s: plan 0.10, read_parse 1.40'
    """
    queued = "" if batch.get("queued_s") is None else f" (its oldest record queued {batch['queued_s']:.2f} s before)"
    parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in batch["phases"].items())
    return f"batch {batch['batch']}, {batch['duration_s']:.2f} s{queued}: {parts}"


def ratio(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator`` rounded to 3 places; None when the denominator is zero.

    >>> ratio(45.0, 50.0)
    0.9
    """
    return round(numerator / denominator, 3) if denominator else None


def timed(action: Callable[[], Any]) -> float:
    """Seconds ``action()`` took."""
    started = time.monotonic()
    action()
    return time.monotonic() - started


def rounded(value: float | None) -> float | None:
    """A figure of the results, to the millisecond (None stays None)."""
    return None if value is None else round(float(value), 3)
