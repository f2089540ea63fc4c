"""The proof matrix: every guarantee x every named crash point, each cell on a fresh topic, sinks and checkpoint
holding the same generated data, reconciled; and what damage each cell must show.

Example::

    >>> cells = run_matrix(Path("examples/orders_to_delta.toml"), spark, workdir=Path("m"))   # doctest: +SKIP
    >>> [(cell.guarantee, cell.point, cell.outcome) for cell in cells][:1]                   # doctest: +SKIP
    [('exactly-once', 'before-sink-write', 'clean')]
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from streamproof import faults
from streamproof.avro import avro_contract, with_subject_pinned
from streamproof.config import (
    AnySinkSpec,
    DeltaSinkSpec,
    FilesSinkSpec,
    PipelineSpec,
    PostgresSinkSpec,
    PythonSinkSpec,
    dump_pipeline,
    load_pipeline,
    parse_pipeline,
)
from streamproof.errors import ConfigError
from streamproof.generator import generate
from streamproof.guarantees import GUARANTEES, wiring_for
from streamproof.harness.cluster import ClusterFaults
from streamproof.harness.crashes import Crash, Emit, HarnessResult, TimelineEvent, run_with_crashes
from streamproof.harness.evidence import evidence_text
from streamproof.reconcile import verify_pipeline
from streamproof.reconcile.counts import check_for
from streamproof.sinks import open_sinks
from streamproof.storage import Location
from streamproof.your_modules import importable_beside


def expected_damage(guarantee: str, point: str, *, has_invalid_records: bool, check: str = "records",
                    partial_writes_visible: bool = False) -> str:  # fmt: skip
    """The damage a guarantee must show when killed at a point: "clean", "duplicated", "lost", or
    "may-duplicate" / "may-lose" where it depends on how far the killed write got.

    A cell that should show damage and does not means the harness missed its fault (a blind harness),
    which is a failure too. Under at-least-once a kill in the middle of the sink write or after it
    duplicates the batch's quarantined records: the quarantine table commits before the sink and is
    appended again on replay; and where the sink shows a write before it is complete (PostgreSQL commits
    per partition, a non-transactional Kafka producer), the part written before the kill is written again.
    A sink holding the latest record per key (``check = "latest"``) absorbs a replay of its own rows.

    >>> expected_damage("at-least-once", "mid-sink-write", has_invalid_records=False)
    'clean'
    >>> expected_damage("at-least-once", "after-sink-commit", has_invalid_records=False, check="latest")
    'clean'
    >>> expected_damage("at-least-once", "after-sink-commit", has_invalid_records=True, check="latest")
    'duplicated'
    """
    wiring = wiring_for(guarantee)
    if wiring.may_duplicate:  # a replay writes again what an unkeyed write had written
        if point == faults.AFTER_SINK_COMMIT and check != "latest":
            return "duplicated"
        if point in (faults.MID_SINK_WRITE, faults.AFTER_SINK_COMMIT) and has_invalid_records:
            return "duplicated"  # the quarantine table was appended before the kill
        if point == faults.MID_SINK_WRITE and partial_writes_visible and check != "latest":
            return "may-duplicate"
    if wiring.may_lose and point == faults.BEFORE_SINK_WRITE:  # marked done before it was written
        return "lost"
    if wiring.may_lose and point == faults.MID_SINK_WRITE:
        return "may-lose" if partial_writes_visible else "lost"
    return "clean"


def fault_hits(where: str, sink: str, labels: Sequence[str]) -> bool:
    """Whether a fault armed at ``where`` hit ``sink``'s write, in a pipeline writing the sinks ``labels`` in that
    order: a point inside one sink's write (``mid-sink-write``, a fault of the machines) hits the sink it names
    (``point:label``), or the first when it names none (as :func:`streamproof.faults.mid_write_armed` arms it); any
    other (before the writes, after their commit, after the checkpoint's, a random kill) hits every sink of the batch.

    >>> [fault_hits(where, "pg", ["delta", "pg"]) for where in ("mid-sink-write", "mid-sink-write:pg",
    ...                                                         "after-sink-commit", "worker-loss:delta")]
    [False, True, True, False]
    """
    point, named = faults.split_point(where)
    return point not in faults.WRITE_POINTS or (named or labels[0]) == sink


def damage_to(sink: str, where: str, labels: Sequence[str], guarantee: str, *, has_invalid_records: bool,
              check: str = "records", partial_writes_visible: bool = False) -> str:  # fmt: skip
    """The damage a crash armed at ``where`` must leave in ``sink`` (:func:`expected_damage`), the sinks of a batch
    being written one after the other in the order of ``labels``. A kill in another sink's write is, to a sink
    written before that one, a kill after its commit; to one written after it, a kill in a write that never began
    (the quarantine committed, nothing of this sink written, so nothing partial).

    >>> how = {"has_invalid_records": False}
    >>> [damage_to(sink, "mid-sink-write:pg", ["delta", "pg", "kafka"], "at-least-once", **how)
    ...  for sink in ("delta", "pg", "kafka")]
    ['duplicated', 'clean', 'clean']
    >>> [damage_to(sink, "mid-sink-write:pg", ["delta", "pg", "kafka"], "at-most-once", **how)
    ...  for sink in ("delta", "pg", "kafka")]
    ['clean', 'lost', 'lost']
    """
    point, named = faults.split_point(where)
    if point == faults.MID_SINK_WRITE and not fault_hits(where, sink, labels):
        written_before = labels.index(sink) < labels.index(named or labels[0])
        return expected_damage(guarantee, faults.AFTER_SINK_COMMIT if written_before else faults.MID_SINK_WRITE,
                               has_invalid_records=has_invalid_records, check=check)  # fmt: skip
    return expected_damage(guarantee, point, has_invalid_records=has_invalid_records, check=check,
                           partial_writes_visible=partial_writes_visible)  # fmt: skip


def worst_damage(damages: Iterable[str]) -> str:
    """The damage several crashes must leave together: a certain damage over a possible one over none (a guarantee
    may lose or duplicate, never both).

    >>> worst_damage(["clean", "may-duplicate", "duplicated"]), worst_damage(["clean", "may-lose"]), worst_damage([])
    ('duplicated', 'may-lose', 'clean')
    """
    damages = set(damages)
    return next((damage for damage in ("lost", "duplicated", "may-lose", "may-duplicate") if damage in damages),
                "clean")  # fmt: skip


def credited(result: HarnessResult, sink: str, labels: Sequence[str]) -> tuple[list[Crash], list[str]]:
    """The crashes, and the faults missed, that a sink's row of a cell carries: those that hit it
    (:func:`fault_hits`); in a fan-out, a fault inside one sink's write is that sink's alone."""
    crashes = [crash for crash in result.crashes if fault_hits(crash.point, sink, labels)]
    missed = [line for where, line in zip(result.missed_at, result.missed, strict=True)
              if fault_hits(where, sink, labels)]  # fmt: skip
    return crashes, missed


@dataclass
class MatrixCell:
    """One guarantee x crash point run, reconciled."""

    guarantee: str
    sink: str
    point: str
    lost: int
    duplicated: int
    unexpected: int
    crashes: list[dict[str, Any]]
    restart_s: float | None
    expected: str  # "clean", "duplicated" or "lost"
    seconds: float
    timeline: list[TimelineEvent] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)  # faults without evidence of happening: the cell fails
    trusted: list[str] = field(default_factory=list)  # terms of the verdict taken on trust (the report's reasons)
    identity_gap: int = 0  # records the reconciliation could not account for: the cell's counts prove nothing

    @property
    def evidence(self) -> str:
        """What shows the cell's fault happened, one line per fault (the crash facts, or Spark's task attempts)."""
        return " | ".join(evidence_text(crash.get("facts", {})) for crash in self.crashes) or "no fault recorded"

    @property
    def outcome(self) -> str:
        """What the cell showed: clean, lost, duplicated, lost+duplicated (unexpected rows count as damage), or
        missed: its fault left no evidence of happening, so its counts prove nothing."""
        if self.missed:
            return "missed"
        if self.identity_gap:
            return "unknown"
        damage = [name for name, count in (("lost", self.lost), ("duplicated", self.duplicated + self.unexpected))
                  if count]  # fmt: skip
        return "+".join(damage) or "clean"

    @property
    def exactly_once(self) -> bool:
        """A cell of a guarantee that allows no damage at all."""
        return wiring_for(self.guarantee).exactly_once

    @property
    def as_expected(self) -> bool:
        """Whether the cell showed the damage its guarantee predicts: rows no record explains (unexpected) never are."""
        if self.missed or self.identity_gap or self.unexpected:
            return False
        if self.expected == "clean":
            return self.outcome == "clean"
        if self.expected.startswith("may-"):
            return self.outcome in ("clean", {"may-duplicate": "duplicated", "may-lose": "lost"}[self.expected])
        if wiring_for(self.guarantee).may_lose:
            return self.lost > 0 and self.duplicated == 0
        return getattr(self, self.expected) > 0 and self.lost == 0

    @property
    def why_not_as_expected(self) -> str:
        """Why the cell is not as expected, in a few words ("" when it is)."""
        if self.as_expected:
            return ""
        if self.missed:
            return f"its fault left no evidence ({'; '.join(self.missed)})"
        if self.unexpected and self.outcome != "unknown":
            return (f"{self.unexpected:,} rows no source record explains (lost {self.lost:,}, duplicated "
                    f"{self.duplicated:,}): no guarantee allows them")  # fmt: skip
        if self.identity_gap:
            return f"{self.identity_gap:,} records the reconciliation could not account for"
        counts = f"lost {self.lost:,}, duplicated {self.duplicated:,}, unexpected {self.unexpected:,}"
        blind = " (a fault that left no damage: a blind harness?)" if self.outcome == "clean" else ""
        return f"expected {self.expected}, showed {self.outcome}: {counts}{blind}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "guarantee": self.guarantee, "sink": self.sink, "point": self.point, "lost": self.lost,
            "duplicated": self.duplicated, "unexpected": self.unexpected, "crashes": self.crashes,
            "restart_s": self.restart_s, "expected": self.expected, "outcome": self.outcome,
            "as_expected": self.as_expected, "missed": self.missed, "evidence": self.evidence,
            "trusted": self.trusted, "identity_gap": self.identity_gap, "seconds": round(self.seconds, 1),
            "timeline": [asdict(event) for event in self.timeline],
        }  # fmt: skip


def batches_of_cell(guarantee: str, faults_armed: int) -> int:
    """The batches a cell's data is cut into, so that each armed fault finds a fresh batch: one before the first
    fault, one per fault (a restart replays the killed batch first; a fault of the machines or each sink of a fan-out
    has one of its own), one to drain. A guarantee that marks a batch done before writing it replays nothing and
    numbers each run's batches from 0, its fault in the second: each crash takes two fresh batches.

    >>> batches_of_cell("exactly-once", 1), batches_of_cell("exactly-once", 3), batches_of_cell("at-most-once", 3)
    (3, 5, 7)
    """
    if wiring_for(guarantee).progress_before_write:
        return 2 * faults_armed + 1
    return faults_armed + 2


def cells_not_as_expected(cells: Iterable[MatrixCell]) -> list[str]:
    """The matrix's verdict: one line per cell that did not show what its guarantee predicts, saying which and why;
    the matrix passes only when there is none. Every cell counts, not only exactly-once's: an at-least-once or
    at-most-once cell whose fault left no evidence, or no damage, is a blind harness, and proves nothing.

    >>> def cell(guarantee, expected, **counts):
    ...     return MatrixCell(guarantee, "delta", "after-sink-commit", **{"lost": 0, "duplicated": 0, "unexpected": 0,
    ...                       **counts}, crashes=[], restart_s=None, expected=expected, seconds=1.0)
    >>> cells_not_as_expected([cell("exactly-once", "clean"), cell("at-least-once", "duplicated", duplicated=40)])
    []
    >>> cells_not_as_expected([cell("at-least-once", "duplicated")])  # doctest: +NORMALIZE_WHITESPACE
    ['at-least-once x after-sink-commit [delta]: expected duplicated, showed clean: lost 0, duplicated 0,
      unexpected 0 (a fault that left no damage: a blind harness?)']
    """
    return [f"{cell.guarantee} x {cell.point} [{cell.sink}]: {cell.why_not_as_expected}" for cell in cells
            if not cell.as_expected]  # fmt: skip


def upstream_shares(spec: PipelineSpec, duplicates: float | None, late: float | None) -> dict[str, float]:
    """The resent and late shares of the matrix data: as given, else 2% and 1% when the pipeline deduplicates
    (its dedup and late handling must be exercised), 0 otherwise."""
    dedup = spec.transform.dedup is not None
    return {
        "duplicates": duplicates if duplicates is not None else 0.02 if dedup else 0.0,
        "late": late if late is not None else 0.01 if dedup else 0.0,
    }


def isolated_sink(sink: AnySinkSpec, workdir: Path | Location) -> AnySinkSpec:
    """The same sink at a fresh location of its own (a matrix cell, a test): a path under ``workdir`` (a local
    folder, or a URI), a PostgreSQL table or Kafka topic with a suffix derived from ``workdir``."""
    workdir = Location(workdir)
    suffix = hashlib.sha1(str(workdir).encode()).hexdigest()[:10]
    if isinstance(sink, DeltaSinkSpec | FilesSinkSpec):
        return sink.model_copy(update={"path": str(workdir / "tables" / sink.name)})
    if isinstance(sink, PostgresSinkSpec):
        return sink.model_copy(update={"table": f"{sink.table[:48]}_{suffix}"})
    if isinstance(sink, PythonSinkSpec):  # your sink: the tables and paths its options name (PythonSinkSpec.options)
        options = dict(sink.options)
        for key, value in sink.options.items():
            if isinstance(value, str) and _copied_per_cell(key) == "table":
                options[key] = f"{value[:48]}_{suffix}"
            elif isinstance(value, str) and _copied_per_cell(key) == "path":
                options[key] = str(workdir / "tables" / f"{sink.name}-{key}")
        return sink.model_copy(update={"options": options})
    marker = None if sink.marker_topic is None else f"{sink.marker_topic}-{suffix}"
    return sink.model_copy(update={"topic": f"{sink.topic}-{suffix}", "marker_topic": marker})


def _copied_per_cell(option: str) -> str | None:
    """What an option of your sink names that each cell gets a copy of: "table" (``table``, ``*_table``), "path"
    (``path``, ``*_path``), or None.

    >>> _copied_per_cell("control_path"), _copied_per_cell("table"), _copied_per_cell("conninfo")
    ('path', 'table', None)
    """
    return next((kind for kind in ("table", "path") if option == kind or option.endswith(f"_{kind}")), None)


def cell_spec(spec: PipelineSpec, guarantee: str, topic: str, workdir: Path | Location,
              max_offsets: int) -> PipelineSpec:  # fmt: skip
    """The pipeline of one matrix cell: same transform and sink kinds, its own topic, sinks and checkpoint under
    ``workdir`` (on the pipeline's distributed storage, for a pipeline that keeps its files there)."""
    workdir = Location(workdir)
    spec = with_subject_pinned(spec)
    sinks = {"sink": isolated_sink(spec.sink, workdir)} if spec.sink is not None else {
        "sinks": [isolated_sink(sink, workdir) for sink in spec.sinks]
    }  # fmt: skip
    return spec.model_copy(update={
        "guarantee": guarantee,
        "checkpoint": str(workdir / "checkpoint"),
        "source": spec.source.model_copy(update={"topic": topic, "max_offsets_per_trigger": max_offsets}),
        "transform": spec.transform.model_copy(update={"quarantine": str(workdir / "tables" / "quarantine")}),
        **sinks,
    })  # fmt: skip


def run_matrix(pipeline_file: Path, spark: SparkSession, *, workdir: Path, count: int = 50_000,
               malformed: float = 0.005, seed: int = 1, guarantees: Iterable[str] = GUARANTEES,
               points: Iterable[str] | None = None, emit: Emit = print, duplicates: float = 0.0, late: float = 0.0,
               cluster: ClusterFaults | None = None) -> list[MatrixCell]:  # fmt: skip
    """Every guarantee x named crash point on fresh topic/sinks/checkpoint with the same generated data
    (``malformed``, ``duplicates`` and ``late`` shares: :func:`streamproof.generator.order_events`); on a cluster,
    also exactly-once x each fault of the machines (:data:`cluster_points`), which the pipeline must survive.

    One cell per sink of the pipeline (a fan-out pipeline gives one cell per sink for each run), each carrying the
    crashes that hit that sink (:func:`credited`: a fan-out's ``mid-sink-write`` is armed in each sink in turn, a run
    each) and expecting the damage all the cell's crashes leave in it (:func:`damage_to`). A sink that no fault of
    the cell hit (a fault of the machines that only some sinks meet) is a row under exactly-once, which allows no
    damage anywhere, and only a line otherwise.
    """
    spec = load_pipeline(pipeline_file)
    importable_beside(spec)  # your code beside the pipeline file: the cells' files are elsewhere, their runs inherit it
    if spec.source.kind != "kafka":
        raise ConfigError(
            f"--matrix generates its data into Kafka topics and needs a kafka source, not {spec.source.kind}: "
            "prove this pipeline with --crash-at POINT or --random-kills K on its own data"
        )
    guarantees = tuple(guarantees)
    stateless = [g for g in guarantees if wiring_for(g).progress_before_write]
    if (spec.transform.watermark is not None or spec.lookups) and stateless:
        why = (
            "a pipeline with dedup or windows refuses it (its restarts lose Spark's state)"
            if spec.transform.watermark is not None
            else "a pipeline with lookups refuses it (its batch ids restart, the recorded versions would be misread)"
        )
        emit(f"{', '.join(stateless)} skipped: {why}")  # fmt: skip
        guarantees = tuple(g for g in guarantees if g not in stateless)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    # A pipeline that keeps its files on distributed storage gets its cells there too (the cells' logs stay local).
    storage = spec.checkpoint_dir.parent / f"matrix-{stamp}" if spec.on_distributed_storage else Location(workdir)
    avro = avro_contract(with_subject_pinned(spec))  # the registry asked once for every cell's data
    for yours in spec.sink_specs:
        if isinstance(yours, PythonSinkSpec) and not any(map(_copied_per_cell, yours.options)):
            emit(f"sink {yours.name}: its options name no table or path (table, path, *_table, *_path), which each "
                 "cell would get a copy of: every cell writes to the same target, and their counts mix")  # fmt: skip
    cells: list[MatrixCell] = []
    planned = _cells(spec, guarantees, points, cluster)
    while planned:
        guarantee, point, armed = planned.pop(0)
        max_offsets = max(100, -(-count // batches_of_cell(guarantee, len(armed))))
        started = time.monotonic()
        name = f"{guarantee}-{point}"
        emit(f"── cell {name} ──")
        cell_dir = workdir / name
        topic = f"{spec.source.topic}-matrix-{stamp}-{name}"
        generate(spec.source.bootstrap_servers, topic, count, partitions=4, malformed=malformed, seed=seed,
                 duplicates=duplicates, late=late, avro=avro)  # fmt: skip
        cell_file = cell_dir / "pipeline.toml"
        cell_dir.mkdir(parents=True, exist_ok=True)
        cell_file.write_text(dump_pipeline(cell_spec(spec, guarantee, topic, storage / name, max_offsets)))
        harness = run_with_crashes(cell_file, armed, log_dir=cell_dir / "logs", emit=emit, cluster=cluster)
        cell_pipeline = parse_pipeline(cell_file.read_text(), source_name=str(cell_file))
        reports = verify_pipeline(spark, cell_pipeline)
        sinks = open_sinks(cell_pipeline)
        labels = [sink.name for sink in sinks]
        for sink, report in zip(sinks, reports, strict=True):
            crashes, missed = credited(harness, sink.name, labels)
            if not crashes and not missed and not wiring_for(guarantee).exactly_once:
                emit(f"   {name} [{report.sink}]: no fault of this cell hit it (lost {report.lost}, duplicated "
                     f"{report.duplicated}, unexpected {report.unexpected}): not a cell")  # fmt: skip
                continue
            restarts = [crash.restarted_in_s for crash in crashes if crash.restarted_in_s is not None]
            expected = worst_damage(
                damage_to(sink.name, where, labels, guarantee, has_invalid_records=malformed > 0,
                          check=check_for(sink.spec).kind, partial_writes_visible=sink.partial_writes_visible)
                for where in armed
            )  # fmt: skip
            if isinstance(sink.spec, PythonSinkSpec):
                expected = your_expected_damage(guarantee, expected, faults.split_point(point)[0])
            cell = MatrixCell(
                guarantee=guarantee, sink=report.sink, point=point, lost=report.lost,
                duplicated=report.duplicated, unexpected=report.unexpected,
                crashes=[crash.to_dict() for crash in crashes],
                restart_s=round(restarts[0], 2) if restarts else None, expected=expected,
                seconds=time.monotonic() - started, timeline=harness.timeline, missed=missed,
                trusted=[reason for reason in report.reasons if " trusted: " in reason],
                identity_gap=report.identity_gap,
            )  # fmt: skip
            emit(f"   {name} [{report.sink}]: lost {cell.lost}, duplicated {cell.duplicated}, "
                 f"unexpected {cell.unexpected} -> {cell.outcome} (expected {cell.expected}); evidence: "
                 f"{cell.evidence}")  # fmt: skip
            cells.append(cell)
        if wiring_for(guarantee).exactly_once:  # the first moment of your writes taught how many they have
            planned[0:0] = moment_cells(guarantee, armed, labels, harness.moments)
    for yours in spec.sink_specs:
        if isinstance(yours, PythonSinkSpec):
            emit(guarantee_given(cells, yours.name))
    return cells


def guarantee_given(cells: Sequence[MatrixCell], sink: str) -> str:
    """What your own sink (``kind = "python"``) gave, from its exactly-once cells: streamproof hands it every batch
    there, replays after each crash included, and keeps no record in it, so loss or duplicates are its code's. Each
    cell is named with the moment of your write its crash landed at; a cell whose crash could not land in your write
    (no moment streamproof can see there) is "not exercised", and never makes the verdict "exactly-once".

    >>> def cell(point, moment=None, missed=(), **counts):
    ...     crashes = [{"facts": {"moment": {"what": moment, "where": "driver"}}}] if moment else []
    ...     return MatrixCell("exactly-once", "ledger", point, **{"lost": 0, "duplicated": 0, "unexpected": 0,
    ...                       **counts}, crashes=crashes, restart_s=None, expected="clean", seconds=1.0,
    ...                       missed=list(missed))
    >>> print(guarantee_given([cell("mid-sink-write#1", "after step 1: save", duplicated=120),
    ...                        cell("mid-sink-write#2", "after step 2: save"), cell("after-sink-commit")], "ledger"))
    ledger (your sink) gave at-least-once: duplicated 120 at mid-sink-write#1 (after step 1: save); clean at \
mid-sink-write#2 (after step 2: save); clean at after-sink-commit
    >>> guarantee_given([cell("mid-sink-write#1", missed=["not reached: nothing durable"]), cell("after-sink-commit")],
    ...                 "ledger")
    'ledger (your sink) gave exactly-once where exercised: clean at after-sink-commit; mid-sink-write#1 not exercised \
(not reached: nothing durable)'
    """
    mine = [cell for cell in cells if cell.sink == sink and cell.exactly_once]
    landed = [cell for cell in mine if not cell.missed]
    lost = any(cell.lost for cell in landed)
    doubled = any(cell.duplicated for cell in landed)
    wrong = any(cell.unexpected for cell in landed)  # rows no record explains: no guarantee allows them
    if not landed:
        verdict = "nothing proven (no crash landed in its write)"
    elif wrong or (lost and doubled):
        verdict = "no guarantee"
    elif lost or doubled:
        verdict = "at-most-once" if lost else "at-least-once"
    else:
        verdict = "exactly-once" if len(landed) == len(mine) else "exactly-once where exercised"
    parts = []
    for cell in landed:
        counts = (("lost", cell.lost), ("duplicated", cell.duplicated), ("unexpected", cell.unexpected))
        damage = ", ".join(f"{name} {count:,}" for name, count in counts if count) or "clean"
        moments = [crash["facts"]["moment"]["what"] for crash in cell.crashes if crash.get("facts", {}).get("moment")]
        parts.append(f"{damage} at {cell.point}" + (f" ({'; '.join(moments)})" if moments else ""))
    parts += [f"{cell.point} not exercised ({'; '.join(cell.missed)})" for cell in mine if cell.missed]
    return f"{sink} (your sink) gave {verdict}: {'; '.join(parts)}"


def first_moment_of_yours(where: str, labels: Sequence[str], yours: set[str]) -> bool:
    """Whether ``where`` is a ``mid-sink-write`` of your own sink that names no moment: the matrix arms its first
    (``#1``), and a cell of each further moment its write turns out to have (:func:`moment_cells`).

    >>> first_moment_of_yours("mid-sink-write:ledger", ["delta", "ledger"], {"ledger"})
    True
    >>> first_moment_of_yours("mid-sink-write", ["delta", "ledger"], {"ledger"})
    False
    """
    point, sink = faults.split_point(where)
    return point == faults.MID_SINK_WRITE and "#" not in where and (sink or labels[0]) in yours


def moment_cells(guarantee: str, armed: Sequence[str], labels: Sequence[str],
                 moments: dict[str, list[str]]) -> list[tuple[str, str, list[str]]]:  # fmt: skip
    """The cells of the further moments of your own sinks' writes, once a cell armed at their first (``#1``) taught how
    many there are (``moments``, by sink label): cell ``mid-sink-write#k`` crashes each that has a k-th (a run each).

    >>> learned = {"a": ["1", "2", "3"], "b": ["1", "2"]}
    >>> for cell in moment_cells("exactly-once", ["mid-sink-write:a#1", "mid-sink-write:b#1"], ["a", "b"], learned):
    ...     print(cell)
    ('exactly-once', 'mid-sink-write#2', ['mid-sink-write:a#2', 'mid-sink-write:b#2'])
    ('exactly-once', 'mid-sink-write#3', ['mid-sink-write:a#3'])
    """
    firsts = {where[: -len("#1")]: len(moments.get(faults.split_point(where)[1] or labels[0], []))
              for where in armed if where.endswith("#1")}  # fmt: skip
    return [(guarantee, f"{faults.MID_SINK_WRITE}#{k}", [f"{where}#{k}" for where, n in firsts.items() if n >= k])
            for k in range(2, max(firsts.values(), default=0) + 1)]  # fmt: skip


def your_expected_damage(guarantee: str, damage: str, point: str) -> str:
    """The damage a cell must leave in your own sink, given the damage a sink streamproof writes would show there
    (``damage``): none under exactly-once (streamproof hands your write every batch, replays included; whether it then
    writes twice or loses is your code's, and the matrix fails on either); under the weaker guarantees your code may
    absorb a replay, or finish its write before the crash, so a certain damage inside or after your write is a possible
    one (a batch never handed to you stays lost).

    >>> your_expected_damage("exactly-once", "clean", "after-sink-commit")
    'clean'
    >>> [your_expected_damage("at-least-once", "duplicated", p) for p in ("mid-sink-write", "after-sink-commit")]
    ['may-duplicate', 'may-duplicate']
    >>> [your_expected_damage("at-most-once", "lost", p) for p in ("mid-sink-write", "before-sink-write")]
    ['may-lose', 'lost']
    """
    if wiring_for(guarantee).exactly_once:
        return "clean"
    if damage == "duplicated":
        return "may-duplicate"
    if damage == "lost" and point == faults.MID_SINK_WRITE:
        return "may-lose"
    return damage


def cluster_points(spec: PipelineSpec, cluster: ClusterFaults | None) -> tuple[str, ...]:
    """The faults of the machines a pipeline can be put through: none without a cluster; the DataNode's only with
    HDFS under it."""
    if cluster is None or spec.spark.master.startswith("local"):
        return ()
    hdfs = cluster.hdfs is not None and any(location.scheme == "hdfs" for location in spec.locations)
    return tuple(point for point in faults.CLUSTER_POINTS if point != faults.DATANODE_RESTART or hdfs)


def faulted_sinks(spec: PipelineSpec, point: str) -> list[str]:
    """The sinks whose writes a fault of the machines is put into, each in a batch of its own: every sink, but for
    ``datanode-restart`` only those whose held task streams into HDFS (Delta append, Parquet): a MERGE's task holds
    while Delta materialises its source, before its files are written, so the DataNode would be back before they
    are (a MERGE of the same batch still runs through the DataNode's return)."""

    def streams_into_hdfs(sink: AnySinkSpec) -> bool:
        if isinstance(sink, FilesSinkSpec) or (isinstance(sink, DeltaSinkSpec) and sink.mode == "append"):
            return Location(str(sink.path)).scheme == "hdfs"
        return False

    return [sink.name for sink in spec.sink_specs if point != faults.DATANODE_RESTART or streams_into_hdfs(sink)]


def _cells(spec: PipelineSpec, guarantees: Iterable[str], points: Iterable[str] | None,
           cluster: ClusterFaults | None) -> list[tuple[str, str, list[str]]]:  # fmt: skip
    """The cells to run, each as (guarantee, point, the points armed in its runs): each guarantee at each named
    point (or ``points``), a point inside a sink's write (``mid-sink-write``) put into every sink's write of a fan-out
    in turn, a run each; exactly-once at each fault of the machines, put into every sink's write in turn.

    >>> spec = parse_pipeline('''name = "p"
    ... source = { kind = "kafka", topic = "t" }
    ... transform = { schema = "id STRING" }
    ... sinks = [{ label = "a", kind = "files", path = "/a" }, { label = "b", kind = "files", path = "/b" }]''')
    >>> for cell in _cells(spec, ["at-least-once"], ["mid-sink-write", "after-sink-commit"], None):
    ...     print(cell)
    ('at-least-once', 'mid-sink-write', ['mid-sink-write:a', 'mid-sink-write:b'])
    ('at-least-once', 'after-sink-commit', ['after-sink-commit'])
    """
    named = list(points) if points is not None else list(faults.NAMED_POINTS)
    labels = [sink.name for sink in spec.sink_specs]

    yours = {sink.name for sink in spec.sink_specs if isinstance(sink, PythonSinkSpec)}

    def each_sink(point: str) -> list[str]:  # a point of one sink's write, unless the point names its sink
        in_a_write = faults.split_point(point)[0] in faults.WRITE_POINTS and ":" not in point
        wheres = [f"{point}:{label}" for label in labels] if in_a_write and len(labels) > 1 else [point]
        return [f"{where}#1" if first_moment_of_yours(where, labels, yours) else where for where in wheres]

    cells = [(guarantee, point, each_sink(point)) for guarantee in guarantees for point in named
             if faults.split_point(point)[0] not in faults.CLUSTER_POINTS]  # fmt: skip
    machines = [point for point in named if faults.split_point(point)[0] in faults.CLUSTER_POINTS]
    if points is None:
        machines = list(cluster_points(spec, cluster))
    for guarantee in [guarantee for guarantee in guarantees if wiring_for(guarantee).exactly_once]:
        for point in machines:
            wheres = [point] if ":" in point else [f"{point}:{sink}" for sink in faulted_sinks(spec, point)]
            cells.append((guarantee, point, wheres))
    return cells
