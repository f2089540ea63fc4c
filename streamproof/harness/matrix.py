"""The proof matrix: every guarantee x every named crash point, each cell on a fresh topic, sinks and checkpoint
holding the same generated data, reconciled (what damage each cell must show: :mod:`streamproof.harness.cells`).

Example::

    >>> cells = run_matrix(Path("examples/orders_to_delta.toml"), spark, workdir=Path("m"))   # doctest: +SKIP
    >>> [(cell.guarantee, cell.point, cell.outcome) for cell in cells][:1]                   # doctest: +SKIP
    [('exactly-once', 'before-sink-write', 'clean')]
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

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
from streamproof.faults import points as faults
from streamproof.generator import generate
from streamproof.guarantees import GUARANTEES, wiring_for
from streamproof.harness.cells import (
    MatrixCell,
    credited,
    damage_to,
    guarantee_given,
    worst_damage,
    your_expected_damage,
)
from streamproof.harness.cluster import ClusterFaults
from streamproof.harness.crashes import Emit, run_with_crashes
from streamproof.reconcile import verify_pipeline
from streamproof.reconcile.counts import check_for
from streamproof.sinks import open_sinks
from streamproof.storage.location import Location
from streamproof.transform.avro import avro_contract, with_subject_pinned
from streamproof.your_code.modules import importable_beside
from streamproof.your_code.steps import MOMENTS_CRASHED


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


def cell_spec(
    spec: PipelineSpec, guarantee: str, topic: str, workdir: Path | Location, max_offsets: int
) -> PipelineSpec:
    """The pipeline of one matrix cell: same transform and sink kinds, its own topic, sinks and checkpoint under
    ``workdir`` (on the pipeline's distributed storage, for a pipeline that keeps its files there)."""
    workdir = Location(workdir)
    spec = with_subject_pinned(spec)
    sinks = (
        {"sink": isolated_sink(spec.sink, workdir)}
        if spec.sink is not None
        else {"sinks": [isolated_sink(sink, workdir) for sink in spec.sinks]}
    )
    return spec.model_copy(
        update={
            "guarantee": guarantee,
            "checkpoint": str(workdir / "checkpoint"),
            "source": spec.source.model_copy(update={"topic": topic, "max_offsets_per_trigger": max_offsets}),
            "transform": spec.transform.model_copy(update={"quarantine": str(workdir / "tables" / "quarantine")}),
            **sinks,
        }
    )


def run_matrix(
    pipeline_file: Path,
    spark: SparkSession,
    *,
    workdir: Path,
    count: int = 50_000,
    malformed: float = 0.005,
    seed: int = 1,
    guarantees: Iterable[str] = GUARANTEES,
    points: Iterable[str] | None = None,
    emit: Emit = print,
    duplicates: float = 0.0,
    late: float = 0.0,
    cluster: ClusterFaults | None = None,
) -> list[MatrixCell]:
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
        emit(f"{', '.join(stateless)} skipped: {why}")
        guarantees = tuple(g for g in guarantees if g not in stateless)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    # A pipeline that keeps its files on distributed storage gets its cells there too (the cells' logs stay local).
    storage = spec.checkpoint_dir.parent / f"matrix-{stamp}" if spec.on_distributed_storage else Location(workdir)
    avro = avro_contract(with_subject_pinned(spec))  # the registry asked once for every cell's data
    for yours in spec.sink_specs:
        if isinstance(yours, PythonSinkSpec) and not any(map(_copied_per_cell, yours.options)):
            emit(
                f"sink {yours.name}: its options name no table or path (table, path, *_table, *_path), which each "
                "cell would get a copy of: every cell writes to the same target, and their counts mix"
            )
    cells: list[MatrixCell] = []
    planned = _cells(spec, guarantees, points, cluster)
    learned: dict[str, list[list[str]]] = {}  # your sinks' moments in the clean batches of every cell so far
    while planned:
        guarantee, point, armed = planned.pop(0)
        max_offsets = max(100, -(-count // batches_of_cell(guarantee, len(armed))))
        started = time.monotonic()
        name = f"{guarantee}-{point}"
        emit(f"── cell {name} ──")
        slug = name.replace("#", "-moment-")  # a topic's and a folder's name: no "#" in either
        cell_dir = workdir / slug
        topic = f"{spec.source.topic}-matrix-{stamp}-{slug}"
        generate(
            spec.source.bootstrap_servers,
            topic,
            count,
            partitions=4,
            malformed=malformed,
            seed=seed,
            duplicates=duplicates,
            late=late,
            avro=avro,
        )
        cell_file = cell_dir / "pipeline.toml"
        cell_dir.mkdir(parents=True, exist_ok=True)
        cell_file.write_text(dump_pipeline(cell_spec(spec, guarantee, topic, storage / slug, max_offsets)))
        harness = run_with_crashes(
            cell_file, armed, log_dir=cell_dir / "logs", emit=emit, cluster=cluster, learned=learned
        )
        for label, lists in harness.seen_moments.items():  # what each later cell's crash is checked against
            learned.setdefault(label, []).extend(lists)
        cell_pipeline = parse_pipeline(cell_file.read_text(), source_name=str(cell_file))
        reports = verify_pipeline(spark, cell_pipeline)
        sinks = open_sinks(cell_pipeline)
        labels = [sink.name for sink in sinks]
        for sink, report in zip(sinks, reports, strict=True):
            crashes, missed = credited(harness, sink.name, labels)
            if report.not_yet_read:  # the cell drained its topic: records it did not read are no proof of anything
                missed = [*missed, f"the pipeline did not read {report.not_yet_read:,} records of its topic"]
            if not crashes and not missed and not wiring_for(guarantee).exactly_once:
                emit(
                    f"   {name} [{report.sink}]: no fault of this cell hit it (lost {report.lost}, duplicated "
                    f"{report.duplicated}, unexpected {report.unexpected}): not a cell"
                )
                continue
            restarts = [crash.restarted_in_s for crash in crashes if crash.restarted_in_s is not None]
            expected = worst_damage(
                damage_to(
                    sink.name,
                    where,
                    labels,
                    guarantee,
                    has_invalid_records=malformed > 0,
                    check=check_for(sink.spec).kind,
                    partial_writes_visible=sink.partial_writes_visible,
                )
                for where in armed
            )
            if isinstance(sink.spec, PythonSinkSpec):
                expected = your_expected_damage(guarantee, expected, faults.split_point(point)[0])
            cell = MatrixCell(
                guarantee=guarantee,
                sink=report.sink,
                point=point,
                lost=report.lost,
                duplicated=report.duplicated,
                unexpected=report.unexpected,
                crashes=[crash.to_dict() for crash in crashes],
                restart_s=round(restarts[0], 2) if restarts else None,
                expected=expected,
                seconds=time.monotonic() - started,
                timeline=harness.timeline,
                missed=missed,
                trusted=[reason for reason in report.reasons if " trusted: " in reason],
                identity_gap=report.identity_gap,
            )
            emit(
                f"   {name} [{report.sink}]: lost {cell.lost}, duplicated {cell.duplicated}, "
                f"unexpected {cell.unexpected} -> {cell.outcome} (expected {cell.expected}); evidence: "
                f"{cell.evidence}"
            )
            cells.append(cell)
        if wiring_for(guarantee).exactly_once:  # the first moment of your writes taught how many they have
            planned[0:0] = moment_cells(guarantee, armed, labels, harness.moments)
    for yours in spec.sink_specs:
        if isinstance(yours, PythonSinkSpec):
            emit(guarantee_given(cells, yours.name))
    return cells


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


def moment_cells(
    guarantee: str, armed: Sequence[str], labels: Sequence[str], moments: dict[str, list[str]]
) -> list[tuple[str, str, list[str]]]:
    """The cells of the further moments of your own sinks' writes, once a cell armed at their first (``#1``) taught how
    many there are (``moments``, by sink label): cell ``mid-sink-write#k`` crashes each that has a k-th (a run each), up
    to :data:`~streamproof.your_code.steps.MOMENTS_CRASHED`.

    >>> learned = {"a": ["1", "2", "3"], "b": ["1", "2"]}
    >>> for cell in moment_cells("exactly-once", ["mid-sink-write:a#1", "mid-sink-write:b#1"], ["a", "b"], learned):
    ...     print(cell)
    ('exactly-once', 'mid-sink-write#2', ['mid-sink-write:a#2', 'mid-sink-write:b#2'])
    ('exactly-once', 'mid-sink-write#3', ['mid-sink-write:a#3'])
    """
    firsts = {
        where[: -len("#1")]: min(len(moments.get(faults.split_point(where)[1] or labels[0], [])), MOMENTS_CRASHED)
        for where in armed
        if where.endswith("#1")
    }
    return [
        (guarantee, f"{faults.MID_SINK_WRITE}#{k}", [f"{where}#{k}" for where, n in firsts.items() if n >= k])
        for k in range(2, max(firsts.values(), default=0) + 1)
    ]


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


def _cells(
    spec: PipelineSpec, guarantees: Iterable[str], points: Iterable[str] | None, cluster: ClusterFaults | None
) -> list[tuple[str, str, list[str]]]:
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

    cells = [
        (guarantee, point, each_sink(point))
        for guarantee in guarantees
        for point in named
        if faults.split_point(point)[0] not in faults.CLUSTER_POINTS
    ]
    machines = [point for point in named if faults.split_point(point)[0] in faults.CLUSTER_POINTS]
    if points is None:
        machines = list(cluster_points(spec, cluster))
    for guarantee in [guarantee for guarantee in guarantees if wiring_for(guarantee).exactly_once]:
        for point in machines:
            wheres = [point] if ":" in point else [f"{point}:{sink}" for sink in faulted_sinks(spec, point)]
            cells.append((guarantee, point, wheres))
    return cells
