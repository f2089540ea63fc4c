"""``streamproof prove JOB.py``: the job crashed at every moment of a batch, restarted, and compared with its twin.

1. **The twin**: the job runs once, uncrashed, in a sandbox of its own (:meth:`AddressMaps.within`): what it writes
   is the expected output, computed by nothing the crashed runs share but the job and the topic. It also tells what
   the job is: its queries, their sinks, the moments of its own writes, the columns that differ from run to run.
2. **A cell per crash**: for each query and each moment (``before-sink-write``, ``mid-sink-write`` (``#k`` for each
   durable step of your own write), ``after-sink-commit``, ``after-checkpoint-commit``), a fresh sandbox: the job is
   started armed (:mod:`streamproof.jobs.moments`) and dies by SIGKILL in the batch after its first, then runs again
   until the topic is drained. The batches are cut alike in every run (``availableNow`` and the same batch size
   over a topic that gets nothing new; a replay reuses its logged offsets), so the cells and the twin see the same
   batches, windows and watermarks.
3. **The comparison**: every output, every reading (:mod:`streamproof.jobs.outputs`), counted against the twin's
   (:mod:`streamproof.jobs.compare`); the verdict per query (:mod:`streamproof.jobs.verdict`).

A crash that did not land where it was armed is a miss, said in its cell, never clean. The job's own failure (in the
twin or any run) ends the proof as the job's error, not as a result.

Example::

    >>> proof = prove_job(Path("examples/jobs/orders_bronze.py"), [], maps, workdir=Path("proof"))  # doctest: +SKIP
    >>> [verdict.guarantee for verdict in proof.verdicts]                                           # doctest: +SKIP
    ['exactly-once']
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from streamproof.errors import ConfigError, PipelineError
from streamproof.faults import points as faults
from streamproof.harness.child import RUN_TIMEOUT_S, PipelineChild
from streamproof.harness.cluster import fault_happened, write_attempts
from streamproof.infra.postgres import PG_DATABASE, PG_DEFAULT_PASSWORD, PG_PASSWORD_ENV, PG_USER
from streamproof.jobs.compare import RowCounts, compare_rows
from streamproof.jobs.inside import is_file_format, local_folder
from streamproof.jobs.maps import AddressMaps, sandbox_database
from streamproof.jobs.moments import CRASH_QUERY_ENV, YOUR_SINKS
from streamproof.jobs.outputs import IndependentReader, SparkReader
from streamproof.jobs.recompute import RECOMPUTED, recomputed_folder
from streamproof.jobs.record import JobRecord, Output, QueryRecord
from streamproof.jobs.scan import JobError, job_digest
from streamproof.jobs.verdict import JobCell, OutputCheck, guarantee_of, why_of
from streamproof.your_code.steps import MOMENTS_CRASHED, landed

Emit = Callable[[str], None]
CRASH_BATCH = 1  # the second batch of a fresh sandbox: the first may be slow, the crash should hit a steady one
JOB_POINTS = (faults.BEFORE_SINK_WRITE, faults.MID_SINK_WRITE, faults.AFTER_SINK_COMMIT, faults.AFTER_CHECKPOINT_COMMIT)


@dataclass
class QueryVerdict:
    """What one query of the job gives, from its cells."""

    query: QueryRecord
    guarantee: str
    why: str
    cells: list[JobCell] = field(default_factory=list)
    by_reading: dict[str, str] = field(default_factory=dict)  # a file sink's readings, each's guarantee
    left_out: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # why no comparison can say ok
    recomputed: RowCounts | None = None  # the twin against a recomputation of the plan as a batch (stateless only)

    @property
    def proven_clean(self) -> bool:
        """Every cell's crash landed and left nothing lost, doubled or unexpected, in every reading, and nothing in
        the query's plan makes a comparison unknowable."""
        return (
            bool(self.cells)
            and not self.unknown
            and all(not cell.missed and cell.outcome == "clean" for cell in self.cells)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query.label,
            "sink": self.query.sink,
            "writes": self.query.address,
            "function": self.query.function,
            "guarantee": self.guarantee,
            "why": self.why,
            "by_reading": self.by_reading,
            "left_out": self.left_out,
            "unknown": self.unknown,
            "twin_against_recomputation": list(self.recomputed.terms()) if self.recomputed is not None else None,
            "moments": self.query.moments,
            "cells": [cell.to_dict() for cell in self.cells],
        }


@dataclass
class JobProof:
    """The whole proof: the twin's record, the verdicts, and the job's digest before and after."""

    job: Path
    twin: JobRecord
    verdicts: list[QueryVerdict]
    digest_before: str
    digest_after: str
    seconds: float
    checker: str = "Spark"

    @property
    def ok(self) -> bool:
        """Every query exactly-once in every cell, nothing missed, the job file unchanged."""
        unchanged = self.digest_before == self.digest_after
        return unchanged and self.checkers_agree and all(verdict.proven_clean for verdict in self.verdicts)

    @property
    def checkers_agree(self) -> bool:
        """Every other checker counted the same terms as the first in every cell (term by term)."""
        return all(cell.checkers_agree for verdict in self.verdicts for cell in verdict.cells)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": str(self.job),
            "sha256_before": self.digest_before,
            "sha256_after": self.digest_after,
            "maps": self.twin.maps,
            "changed": self.twin.overrides,
            "not_applied": self.twin.not_applied,
            "queries": [verdict.to_dict() for verdict in self.verdicts],
            "checker": self.checker,
            "checkers_agree": self.checkers_agree,
            "seconds": round(self.seconds, 1),
            "ok": self.ok,
        }


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class JobProver:
    """Runs the twin and the cells of one job (see the module)."""

    def __init__(
        self,
        job: Path,
        argv: list[str],
        maps: AddressMaps,
        *,
        workdir: Path,
        emit: Emit = print,
        master: str | None = None,
        timeout_s: float = RUN_TIMEOUT_S,
    ) -> None:
        self.job = job.resolve()
        self.argv = argv
        self.maps = maps
        self.workdir = workdir.resolve()
        self.emit = emit
        self.master = master
        self.timeout_s = timeout_s
        self.stamp = time.strftime("%Y%m%dt%H%M%S")

    def _arguments(self, sandbox: str, folder: Path, local: bool = False) -> list[str]:
        arguments = ["--job-state", str(folder / "state"), "--sandbox", sandbox, "--local-root", str(folder / "local")]
        if self.maps.kafka:
            arguments += ["--kafka", self.maps.kafka]
        for path in self.maps.paths:
            arguments += ["--input" if path.input else "--map", f"{path.source}={path.target}"]
        for source, target in self.maps.topics:
            arguments += ["--topic", f"{source}={target}"]
        if self.master and not local:
            arguments += ["--master", self.master]
        return [*arguments, "--", *self.argv] if self.argv else arguments

    def sandbox(self, name: str) -> tuple[str, Path]:
        return f"{self.stamp}-{name}", self.workdir / name

    def run_child(
        self,
        name: str,
        run: str,
        crash: faults.ArmedCrash | None = None,
        query: str | None = None,
        arguments: list[str] | None = None,
        local: bool = False,
    ) -> tuple[PipelineChild, int]:
        sandbox, folder = self.sandbox(name)
        if not folder.exists():
            make_sandbox_databases(self.maps, sandbox)
        environment = {CRASH_QUERY_ENV: query} if query else {}
        child = PipelineChild(
            self.job,
            folder / "logs",
            name=run,
            available_now=False,
            crash=crash,
            arguments=[*(arguments or []), *self._arguments(sandbox, folder, local)],
            environment=environment,
        )
        try:
            code = child.wait(self.timeout_s)
        finally:
            child.close()
        return child, code

    def _job_failed(self, child: PipelineChild, code: int, what: str) -> JobError:
        line = child.error_line()
        text = line.removeprefix("error: ") if line else f"exited with code {code}"
        return JobError(f"{text} ({what}; log: {child.log_path})")

    def twin(self, recompute: bool = False) -> JobRecord:
        """The crash-free twin: the job drained once in a sandbox of its own, in local mode (it shares neither a
        cluster nor its executors with the crashed runs); with ``recompute``, then its plan as one batch over the same
        records, in the same process (:meth:`recompute` compares them)."""
        self.emit(f"twin: {self.job.name} uncrashed, in its own sandbox")
        child, code = self.run_child("twin", "run-1", arguments=["--then-recompute"] if recompute else [], local=True)
        if code != 0:
            raise self._job_failed(child, code, "the twin, uncrashed")
        record = JobRecord.read(self.sandbox("twin")[1] / "state")
        if record is None:
            raise PipelineError(f"the twin left no record; log: {child.log_path}")
        for line in record.overrides:
            self.emit(f"changed: {line}")
        return record

    def recompute(self, twin: JobRecord, reader: Any) -> dict[str, RowCounts]:
        """The second oracle (:mod:`streamproof.jobs.recompute`): each stateless query of Spark's own sink, its plan
        run once as a batch over the twin's records, compared with what the twin wrote (by query)."""
        stateless = [
            query for query in twin.queries if not query.stateful and query.sink not in YOUR_SINKS and query.address
        ]
        if not stateless or not twin.topics:
            return {}
        self.emit(f"recomputation: {', '.join(q.label for q in stateless)} as one batch over the twin's records")
        found = {}
        for query in stateless:
            address = str(query.address)
            output = twin.outputs.get(address if query.sink != "kafka" else f"kafka:{address}")
            if output is None:
                continue
            reading = "spark" if is_file_format(query.sink) else "rows"
            folder = recomputed_folder(self.sandbox("twin")[1] / "state" / RECOMPUTED, query.label)
            batch = reader.read(Output(str(folder), "parquet"))["spark"]
            found[query.label] = compare_rows(reader.read(output).get(reading, []), batch, query.left_out)
            counts = found[query.label]
            self.emit(f"[{query.label}] the twin against its recomputation: lost {counts.lost}, duplicated "
                      f"{counts.duplicated}, unexpected {counts.unexpected} of {counts.twin_rows:,} rows")  # fmt: skip
        return found

    def points_of(self, query: QueryRecord, chosen: list[str] | None) -> list[str]:
        """The crash points of a query's cells: each moment of its batch, and each durable step of your write."""
        wanted = chosen or list(JOB_POINTS)
        points = []
        for where in wanted:
            point = faults.split_moment(where)[0]
            if point == faults.EXECUTOR_MID_WRITE:
                if not self.master or self.master.startswith("local"):
                    raise ConfigError(
                        f"--crash-at {point}: a fault of a cluster's machines needs --master spark://... "
                        "(`streamproof infra up --spark-workers 2`, docs/cluster.md)"
                    )
                if query.sink not in ("foreachBatch", "foreach"):
                    raise ConfigError(
                        f"--crash-at {point}: {query.label} writes with Spark's own {query.sink} sink; an executor is "
                        "killed mid-write in a job's foreachBatch or foreach write (docs/jobs.md)"
                    )
                points.append(where)
                continue
            if point not in JOB_POINTS:
                raise ConfigError(
                    f"--crash-at {where!r}: a job's crash points are {', '.join(JOB_POINTS)} (#k), and "
                    f"{faults.EXECUTOR_MID_WRITE} on a cluster"
                )
            if point == faults.MID_SINK_WRITE and query.sink in ("foreachBatch", "foreach") and "#" not in where:
                steps = max(1, min(len(query.moments), MOMENTS_CRASHED))
                points += [f"{point}#{k}" for k in range(1, steps + 1)]
            else:
                points.append(where)
        return points

    def _survived(
        self, cell: JobCell, child: PipelineChild, code: int, twin: JobRecord, readers: dict[str, Any], started: float
    ) -> JobCell:
        """A fault of the machines: the run must survive it and drain; Spark's event log must show it happened."""
        if code != 0:
            raise self._job_failed(child, code, f"the run through {cell.point}")
        events = child.log_path.parent / "spark-events"
        cell.facts = write_attempts(events, cell.batch_id, cell.query)
        if cell.landed is None:
            cell.missed = f"{cell.point}: the write of batch {cell.batch_id} ended before every executor was busy"
        elif missed := fault_happened(cell.point, cell.facts):
            cell.missed = f"{missed}; event log: {events}"
        self.emit(f"[{cell.query}] {cell.point}: {cell.landed or cell.missed}; Spark's event log: {cell.facts}")
        return self._compared(cell, child.log_path.parent.parent, twin, readers, started)

    def _compared(
        self, cell: JobCell, folder: Path, twin: JobRecord, readers: dict[str, Any], started: float
    ) -> JobCell:
        """The cell's drained outputs against the twin's, by every checker."""
        record = JobRecord.read(folder / "state")
        (first, reader), *others = readers.items()
        cell.checks = compare_outputs(twin, record, reader, self.maps)
        cell.checker = first
        for name, other in others:  # every output read again by each other checker: the terms must be the same
            cell.also[name] = compare_outputs(twin, record, other, self.maps)
        cell.seconds = time.monotonic() - started
        lost, duplicated, unexpected = cell.damage()
        terms = f"lost {lost}, duplicated {duplicated}, unexpected {unexpected}"
        self.emit(f"[{cell.query}] {cell.point}: {cell.outcome} ({terms})")
        return cell

    def cell(self, query: QueryRecord, where: str, twin: JobRecord, readers: dict[str, Any]) -> JobCell:
        """One crash at ``where`` in ``query``'s batch, the restarts, the comparison."""
        started = time.monotonic()
        name = f"{query.order}-{_slug(where)}"
        point, moment = faults.split_moment(where)
        armed = faults.ArmedCrash(point, CRASH_BATCH, None, moment)
        self.emit(f"[{query.label}] crash at {where} in batch {CRASH_BATCH}")
        child, code = self.run_child(name, "run-1", armed, query.label)
        folder = self.sandbox(name)[1]
        landing = landed(folder / "logs" / "faults", CRASH_BATCH, query.label)
        record = JobRecord.read(folder / "state")
        cell = JobCell(query.label, where, CRASH_BATCH, landing.get("what") if landing else None, None, runs=1)
        if point in faults.CLUSTER_POINTS:  # the run survives it: no restart, its own drain is the cell's
            return self._survived(cell, child, code, twin, readers, started)
        if code != -signal.SIGKILL:
            if code != 0:
                raise self._job_failed(child, code, f"the run armed at {where}")
            cell.missed = f"the run drained before batch {CRASH_BATCH} reached {where} (too few records?)"
        elif landing is None:
            cell.missed = f"killed, but not at {where}: no landing recorded; log: {child.log_path}"
        elif not landing.get("reached", True):
            cell.missed = str(landing.get("what"))
        mine = record.query(query.label) if record is not None else None
        cell.facts = batch_facts(mine or query, CRASH_BATCH)
        if cell.missed is None and (contradiction := contradicts(point, cell.facts)):
            cell.missed = f"{where}: {contradiction}"
        self.emit(f"[{query.label}] {where}: {cell.landed or cell.missed}; on disk: {cell.facts}")
        child, code = self.run_child(name, "run-2")
        cell.runs += 1
        if code != 0:
            raise self._job_failed(child, code, f"the restart after {where}")
        return self._compared(cell, folder, twin, readers, started)


def make_sandbox_databases(maps: AddressMaps, sandbox: str) -> list[str]:
    """Each PostgreSQL map's database for a sandbox: a copy of the target database (``CREATE DATABASE ... TEMPLATE``),
    so that the tables the job expects are there, and nothing of one sandbox in another's."""
    import psycopg

    made = []
    for path in maps.paths:
        target = urlsplit(path.target.removeprefix("jdbc:"))
        if path.input or target.scheme not in ("postgresql", "postgres"):
            continue
        template = target.path.strip("/") or PG_DATABASE
        database = sandbox_database(template, sandbox)
        settings: dict[str, Any] = {
            "host": target.hostname or "127.0.0.1",
            "port": target.port or 5432,
            "user": target.username or PG_USER,
            "password": target.password or os.environ.get(PG_PASSWORD_ENV, PG_DEFAULT_PASSWORD),
            "dbname": "postgres",
            "autocommit": True,
            "connect_timeout": 10,
        }
        try:
            with psycopg.connect(**settings) as connection:
                connection.execute(f'CREATE DATABASE "{database}" TEMPLATE "{template}"')
        except psycopg.Error as error:
            raise ConfigError(
                f"--map {path.source}={path.target}: cannot copy database {template!r} for a sandbox "
                f"({str(error).strip().splitlines()[0]}): close its other sessions, or map to a database nobody uses"
            ) from None
        made.append(database)
    return made


def batch_facts(query: QueryRecord, batch_id: int) -> dict[str, Any]:
    """What a crash in ``batch_id`` left in the query's checkpoint and sink (local storage; {} elsewhere)."""
    checkpoint = local_folder(query.checkpoint) if query.checkpoint else None
    if checkpoint is None:
        return {}
    facts: dict[str, Any] = {
        "offsets_logged": (Path(checkpoint) / "offsets" / str(batch_id)).exists(),
        "checkpoint_committed": (Path(checkpoint) / "commits" / str(batch_id)).exists(),
    }
    folder = local_folder(query.location) if query.location else None
    if folder is not None and query.sink == "delta":
        facts["sink_has_batch"] = delta_holds(Path(folder), query.query_id, batch_id)
    elif folder is not None and is_file_format(query.sink):
        facts["sink_has_batch"] = (Path(folder) / "_spark_metadata" / str(batch_id)).exists()
    return facts


def delta_holds(table: Path, query_id: str | None, batch_id: int) -> bool:
    """Whether a Delta table's log holds the streaming write of ``batch_id`` by ``query_id`` (its txn action)."""
    log = table / "_delta_log"
    for commit in sorted(log.glob("*.json")) if log.is_dir() else []:
        for line in commit.read_text().splitlines():
            action = json.loads(line).get("txn") if line.strip() else None
            if action and action.get("appId") == query_id and int(action.get("version", -1)) == batch_id:
                return True
    return False


def contradicts(point: str, facts: dict[str, Any]) -> str | None:
    """Why the facts on disk do not fit a crash at ``point`` (None when they do, or nothing could be read).

    >>> contradicts("after-sink-commit", {"offsets_logged": True, "checkpoint_committed": True})
    'Spark had already committed the batch'
    """
    if not facts:
        return None
    if not facts.get("offsets_logged"):
        return "the batch was not in the offset log"
    committed = facts.get("checkpoint_committed")
    if point == faults.AFTER_CHECKPOINT_COMMIT:
        return None if committed else "Spark had not committed the batch"
    if committed:
        return "Spark had already committed the batch"
    held = facts.get("sink_has_batch")
    if point in (faults.BEFORE_SINK_WRITE, faults.MID_SINK_WRITE) and held:
        return "the sink already held the batch"
    if point == faults.AFTER_SINK_COMMIT and held is False:
        return "the sink did not hold the batch"
    return None


def compare_outputs(twin: JobRecord, run: JobRecord | None, reader: Any, maps: AddressMaps) -> list[OutputCheck]:
    """Every output of the twin or the run, every reading, compared."""
    checks = []
    outputs = run.outputs if run is not None else {}
    for address in sorted({*twin.outputs, *outputs}):
        expected, held = twin.outputs.get(address), outputs.get(address)
        anyone = expected or held
        assert anyone is not None
        query = twin.query(anyone.query) if anyone.query else None
        left_out = query.left_out if query is not None and query.sink not in ("foreachBatch", "foreach") else {}
        twin_rows = reader.read(expected) if expected is not None else {}
        run_rows = reader.read(held) if held is not None else {}
        for reading in sorted({*twin_rows, *run_rows}):
            counts = compare_rows(twin_rows.get(reading, []), run_rows.get(reading, []), left_out)
            checks.append(OutputCheck(address, reading, anyone.query, counts))
    return checks


def prove_job(
    job: Path,
    argv: list[str],
    maps: AddressMaps,
    *,
    workdir: Path,
    points: list[str] | None = None,
    emit: Emit = print,
    master: str | None = None,
    independent: bool = False,
    spark: Any = None,
    timeout_s: float = RUN_TIMEOUT_S,
) -> JobProof:
    """The proof of ``job`` (see the module): the twin, a cell per query and crash point, the verdicts."""
    started = time.monotonic()
    before = job_digest(job)
    prover = JobProver(job, argv, maps, workdir=workdir, emit=emit, master=master, timeout_s=timeout_s)
    twin = prover.twin(recompute=True)
    readers: dict[str, Any] = {"Spark": SparkReader(spark, maps)} if spark is not None else {}
    if independent:
        readers["independent"] = IndependentReader(maps)
    if not readers:
        raise ConfigError("a proof needs a checker: a Spark session, or independent=True")
    recomputed = prover.recompute(twin, next(iter(readers.values())))
    cells = [
        prover.cell(query, where, twin, readers) for query in twin.queries for where in prover.points_of(query, points)
    ]
    verdicts = [verdict_of(query, cells, recomputed.get(query.label)) for query in twin.queries]
    return JobProof(job, twin, verdicts, before, job_digest(job), time.monotonic() - started, " and ".join(readers))


def verdict_of(query: QueryRecord, cells: list[JobCell], recomputed: RowCounts | None = None) -> QueryVerdict:
    """The query's verdict from every cell of the job (a crash armed in another query kills this one at some moment
    of its own), each judged by the query's outputs: the guarantee (the weakest reading's; a file sink's readings
    each said). Its cells are those armed in it, then those of other queries that damaged it."""
    judged = [_only(cell, query.label) for cell in cells]
    mine = [cell for cell in judged if cell.query == query.label]
    mine += [cell for cell in judged if cell.query != query.label and not cell.missed and cell.outcome != "clean"]
    readings = sorted({check.reading for cell in mine for check in cell.checks})
    unknown = list(query.unknown)
    if recomputed is not None and not recomputed.clean:
        lost, duplicated, unexpected = recomputed.terms()
        unknown.append(
            f"the twin and a recomputation of the job's plan as one batch over the same records disagree (lost "
            f"{lost:,}, duplicated {duplicated:,}, unexpected {unexpected:,}): the twin is no oracle for this query"
        )
    guarantee = guarantee_of(mine, unknown)
    by_reading = {reading: guarantee_of(mine, unknown, reading) for reading in readings} if len(readings) > 1 else {}
    left_out = {name: why for cell in mine for check in cell.checks for name, why in check.counts.left_out.items()}
    why = why_of(query.sink, query.function, mine, query.moments)
    return QueryVerdict(query, guarantee, why, mine, by_reading, left_out, unknown, recomputed)


def _only(cell: JobCell, label: str) -> JobCell:
    """The cell with the checks of one query's outputs (a crash kills the whole job: others are judged by theirs). A
    cell with no output of the query to compare proves nothing: missed, never clean."""
    checks = [check for check in cell.checks if check.query in (label, None)]
    missed = cell.missed or (None if checks else f"no output of {label} was found to compare (it wrote nothing seen)")
    also = {name: [check for check in found if check.query in (label, None)] for name, found in cell.also.items()}
    return JobCell(
        cell.query, cell.point, cell.batch_id, cell.landed, missed, checks, cell.facts, cell.seconds, cell.runs,
        cell.checker, also,
    )  # fmt: skip
