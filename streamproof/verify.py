"""Reconciliation of a source against a sink: lost, duplicated, quarantined, unexpected.

The checker (:func:`reconcile`) is a pure function of three datasets, Jepsen-style: the source records
(coordinates + whether each is valid), the sink rows and the quarantine rows. Reading Kafka and Delta
happens before it (:func:`read_datasets`), so the same checker serves ``verify``, ``prove``, the tests
and the benchmarks. The datasets are Spark DataFrames so that a 100M-record topic reconciles the same
way as a hand-made one; every figure is an exact count from the data.

Rules (DESIGN.md): every valid source record must be in the sink exactly once and every invalid one
in quarantine exactly once, matched on source coordinates (topic, partition, offset), or on the
dedup key columns when the pipeline deduplicates (then ``expected`` = distinct valid keys and the
extra valid records are ``upstream_duplicates``).

* ``lost``: expected records (or keys) missing from the sink, plus invalid records missing from quarantine;
* ``duplicated``: extra rows for one record (or key), in the sink or in quarantine;
* ``unexpected``: rows no source record explains (unknown coordinates, a valid record in quarantine,
  an invalid record in the sink);
* ``source_records = expected + quarantined + upstream_duplicates`` holds whenever ``ok``.

Example::

    >>> report = reconcile(source, sink, quarantine)                 # doctest: +SKIP
    >>> report.lost, report.duplicated, report.ok                    # doctest: +SKIP
    (0, 0, True)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamproof.config import PipelineSpec
from streamproof.sources import kafka as kafka_source
from streamproof.transform import COORDINATES, REJECT_REASON, parse_records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

VALID = "_valid"


@dataclass
class Report:
    """The reconciliation report; ``to_json`` gives DESIGN.md's format."""

    pipeline: str
    guarantee: str
    sink: str
    source_records: int
    expected: int
    quarantined: int
    upstream_duplicates: int
    sink_records: int
    lost: int
    duplicated: int
    unexpected: int
    crashes: list[dict[str, Any]] = field(default_factory=list)
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    generated: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0

    @property
    def guarantee_held(self) -> bool:
        """Whether the damage found is within what the guarantee promises.

        exactly-once allows none; at-least-once allows duplicates, never loss; at-most-once allows loss,
        never duplicates. Unexpected rows are never allowed.
        """
        if self.unexpected:
            return False
        if self.guarantee == "at-least-once":
            return self.lost == 0
        if self.guarantee == "at-most-once":
            return self.duplicated == 0
        return self.ok

    @property
    def identity_holds(self) -> bool:
        return self.source_records == self.expected + self.quarantined + self.upstream_duplicates

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.generated is None:
            data.pop("generated")
        data["ok"] = self.ok
        data["guarantee_held"] = self.guarantee_held
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@dataclass(frozen=True)
class Counts:
    source_records: int
    expected: int
    quarantined: int
    upstream_duplicates: int
    sink_records: int
    lost: int
    duplicated: int
    unexpected: int


def reconcile(
    source: DataFrame, sink: DataFrame, quarantine: DataFrame, key_columns: list[str] | None = None
) -> Counts:
    """Exact counts from three datasets.

    ``source``: one row per source record with the coordinate columns and a boolean ``_valid``
    (plus ``key_columns`` when deduplicating). ``sink``: the coordinate columns (or ``key_columns``).
    ``quarantine``: the coordinate columns.
    """
    from pyspark.sql import functions as F

    coords = list(COORDINATES)
    sink_side = _identity_side(source, sink, key_columns)
    quarantine_side = (
        source.select(*coords, F.col(VALID))
        .join(quarantine.groupBy(*coords).agg(F.count(F.lit(1)).alias("n")), coords, "full_outer")
        .agg(
            F.sum(F.when(F.col(VALID).isNull() | F.col(VALID), F.coalesce("n", F.lit(0))).otherwise(0)).alias("u"),
            F.sum(F.when(~F.col(VALID) & F.col("n").isNull(), 1).otherwise(0)).alias("lost"),
            F.sum(F.when(~F.col(VALID) & (F.col("n") > 1), F.col("n") - 1).otherwise(0)).alias("dup"),
            F.sum(F.when(~F.col(VALID) & F.col("n").isNotNull(), 1).otherwise(0)).alias("quarantined"),
            F.sum(F.when(F.col(VALID).isNotNull(), 1).otherwise(0)).alias("source_records"),
            F.sum(F.when(F.col(VALID), 1).otherwise(0)).alias("valid_records"),
        )
        .first()
    )
    valid_records = int(quarantine_side["valid_records"] or 0)
    expected = sink_side["expected"]
    return Counts(
        source_records=int(quarantine_side["source_records"] or 0),
        expected=expected,
        quarantined=int(quarantine_side["quarantined"] or 0),
        upstream_duplicates=valid_records - expected,
        sink_records=sink_side["sink_records"],
        lost=sink_side["lost"] + int(quarantine_side["lost"] or 0),
        duplicated=sink_side["duplicated"] + int(quarantine_side["dup"] or 0),
        unexpected=sink_side["unexpected"] + int(quarantine_side["u"] or 0),
    )


def _identity_side(source: DataFrame, sink: DataFrame, key_columns: list[str] | None) -> dict[str, int]:
    """Sink rows against valid source records, matched on coordinates or on the dedup key."""
    from pyspark.sql import functions as F

    identity = list(key_columns) if key_columns else list(COORDINATES)
    # Per identity: is any source record with it valid / present at all?
    source_ids = source.groupBy(*identity).agg(
        F.max(F.col(VALID).cast("int")).alias("any_valid"),
    )
    sink_ids = sink.groupBy(*identity).agg(F.count(F.lit(1)).alias("n"))
    row = (
        source_ids.join(sink_ids, identity, "full_outer")
        .agg(
            F.sum(F.when(F.col("any_valid") == 1, 1).otherwise(0)).alias("expected"),
            F.sum(F.when((F.col("any_valid") == 1) & F.col("n").isNull(), 1).otherwise(0)).alias("lost"),
            F.sum(F.when((F.col("any_valid") == 1) & (F.col("n") > 1), F.col("n") - 1).otherwise(0)).alias("dup"),
            F.sum(
                F.when(F.col("any_valid").isNull() | (F.col("any_valid") == 0), F.coalesce("n", F.lit(0))).otherwise(0)
            ).alias("unexpected"),
            F.sum(F.coalesce("n", F.lit(0))).alias("sink_records"),
        )
        .first()
    )
    return {
        "expected": int(row["expected"] or 0),
        "lost": int(row["lost"] or 0),
        "duplicated": int(row["dup"] or 0),
        "unexpected": int(row["unexpected"] or 0),
        "sink_records": int(row["sink_records"] or 0),
    }


def read_datasets(spark: SparkSession, spec: PipelineSpec) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Read (source, sink, quarantine) for :func:`reconcile`: the topic through the same transform as
    the pipeline (read_committed, earliest to latest), and the two Delta tables as they are now."""
    from pyspark.sql import functions as F

    parsed = parse_records(kafka_source.read_batch(spark, spec.source), spec.transform)
    keys = spec.transform.dedup.columns if spec.transform.dedup else []
    source = parsed.select(*COORDINATES, *keys, F.col(REJECT_REASON).isNull().alias(VALID))
    sink = _read_delta_or_empty(spark, spec.sink_path, [*COORDINATES, *keys], source)
    quarantine = _read_delta_or_empty(spark, spec.quarantine_path, list(COORDINATES), source)
    return source, sink, quarantine


def _read_delta_or_empty(spark: SparkSession, path: Path, columns: list[str], like: DataFrame) -> DataFrame:
    from delta.tables import DeltaTable

    if DeltaTable.isDeltaTable(spark, str(path)):
        return spark.read.format("delta").load(str(path)).select(*columns)
    # A sink that was never written holds nothing: every expected record counts as lost.
    return like.select(*columns).limit(0)


def quarantine_reasons(spark: SparkSession, spec: PipelineSpec) -> dict[str, int]:
    """Quarantined rows per reason, as stored in the quarantine table."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, str(spec.quarantine_path)):
        return {}
    rows = spark.read.format("delta").load(str(spec.quarantine_path)).groupBy("reason").count().collect()
    return {row["reason"]: int(row["count"]) for row in sorted(rows, key=lambda r: r["reason"])}


def verify_pipeline(spark: SparkSession, spec: PipelineSpec, manifest_dir: Path | None = None) -> Report:
    """Read everything the pipeline touched and reconcile it (the ``streamproof verify`` command)."""
    source, sink, quarantine = read_datasets(spark, spec)
    source = source.cache()
    try:
        keys = spec.transform.dedup.columns if spec.transform.dedup else None
        counts = reconcile(source, sink, quarantine, key_columns=keys)
    finally:
        source.unpersist()
    report = Report(
        pipeline=spec.name,
        guarantee=spec.guarantee,
        sink=spec.sink.kind,
        **asdict(counts),
        quarantine_reasons=quarantine_reasons(spark, spec),
    )
    if manifest_dir is not None:
        from streamproof.generator import load_manifest

        manifest = load_manifest(manifest_dir, spec.source.topic)
        if manifest:
            report.generated = {"records": manifest["records"], "malformed": manifest["malformed"]}
    return report
