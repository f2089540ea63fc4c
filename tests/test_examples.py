"""Every example pipeline runs and reconciles: its transform and sinks as written, pointed at the test broker and
PostgreSQL, on a fresh topic with its own checkpoint, tables and topics (the prover's isolation).

Data: 4,000 generated orders (0.5% malformed), two batches, run until drained and verified. Examples that read
the same source through the same transform under the same guarantee run as one pipeline, their sinks side by side
(each sink section exactly as its file writes it, labelled by the file): one run proves them all, in the CI budget.
Expected: every sink of every example 0 lost / 0 duplicated / 0 unexpected, every record accounted for. No crash
here: each sink kind and mode is killed mid-write and after its commit in test_sinks_exactly_once.py. Not run again:
``orders_to_delta.toml`` (the plugin tests run it through crashes), ``orders_fanout.toml`` (its Delta MERGE,
PostgreSQL totals and Kafka sinks are among ``all_sinks.toml``'s), ``orders_dedup_to_delta.toml`` and
``customer_windows_to_delta.toml`` (test_dedup.py runs them through the crash matrix), ``all_sinks.toml``
(its six sinks are those of test_sinks_exactly_once.py), ``orders_silver_from_bronze.toml`` (its source is a
Delta table: test_delta_source.py runs the same pipeline through a crash), ``orders_to_delta_cluster.toml``
(it needs a cluster and HDFS: test_cluster.py runs it through the cluster's faults) and ``every_sink_kind.toml``
(the long nemesis runs' pipeline: its Delta append, PostgreSQL totals, Kafka and Parquet sinks are those of
test_replay_through.py, its Delta MERGE that of test_sinks_exactly_once.py), ``orders_to_s3.toml`` (it needs an S3
server: test_s3.py runs its layout, checkpoint, table and quarantine on s3a://, through a crash),
``orders_on_kafka_cluster.toml`` (it needs three brokers: test_kafka_cluster.py runs it through their faults),
``orders_to_kafka_and_delta_on_cluster.toml`` (the 300-step cluster nemesis's pipeline, on three brokers: its Kafka
sink is that of orders_on_kafka_cluster.toml, its Delta append that of test_replay_through.py).
``orders_partitioned_to_delta.toml`` runs once, SIGKILLed in the middle of each partitioned write (append, MERGE),
then compacted per partition.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from conftest import REPO
from streamproof.config import KafkaSinkSpec, PipelineSpec, PostgresSinkSpec, Transform, load_pipeline
from streamproof.infra import PostgresServer
from streamproof.reconcile.independent import disagreements, verify_independently
from streamproof.testing import Prover

pytestmark = [pytest.mark.integration, pytest.mark.crash]

ALREADY_RUN = (
    "orders_to_delta.toml",
    "orders_fanout.toml",
    "all_sinks.toml",
    "orders_dedup_to_delta.toml",
    "customer_windows_to_delta.toml",
    "orders_silver_from_bronze.toml",
    "orders_to_delta_cluster.toml",
    "orders_partitioned_to_delta.toml",  # test_partitioned_example_survives_kills_...
    "every_sink_kind.toml",  # the long nemesis runs' pipeline (see the module docstring)
    "orders_to_s3.toml",  # its layout on s3a:// runs through a crash on the suite's S3 server in test_s3.py
    "orders_on_kafka_cluster.toml",  # it needs three brokers: test_kafka_cluster.py runs it through their faults
    "orders_to_kafka_and_delta_on_cluster.toml",  # the 300-step cluster nemesis's pipeline (see the module docstring)
)
EXAMPLES = sorted(path for path in (REPO / "examples").glob("*.toml") if path.name not in ALREADY_RUN)


def on_test_servers(spec: PipelineSpec, broker: str, postgres: PostgresServer) -> PipelineSpec:
    """The example with its Kafka sinks on the test broker and its PostgreSQL sinks on the test server."""

    def moved(sink: object) -> object:
        if isinstance(sink, KafkaSinkSpec):
            return sink.model_copy(update={"bootstrap_servers": broker})
        if isinstance(sink, PostgresSinkSpec):
            return sink.model_copy(update={"host": "127.0.0.1", "port": postgres.port})
        return sink

    if spec.sink is not None:
        return spec.model_copy(update={"sink": moved(spec.sink)})
    return spec.model_copy(update={"sinks": [moved(sink) for sink in spec.sinks]})


PROVER_SETS = {"topic", "subscribe", "bootstrap_servers", "max_offsets_per_trigger", "maxOffsetsPerTrigger"}


def example_groups(examples: list[Path]) -> dict[str, list[Path]]:
    """The examples by what they share, read from their files' tables: guarantee, source (but what the prover sets:
    topic, brokers, batch size), transform (but its quarantine table, defaults filled in), Spark settings. Each group
    runs as one pipeline of the examples' own sinks."""
    groups: dict[str, list[Path]] = {}
    for example in examples:
        tables = tomllib.loads(example.read_text())
        source = {key: value for key, value in tables.get("source", {}).items() if key not in PROVER_SETS}
        transform = Transform.model_validate(tables.get("transform", {})).model_dump(exclude={"quarantine"})
        shared = [tables.get("guarantee", "exactly-once"), source, transform, tables.get("spark")]
        groups.setdefault(json.dumps(shared, sort_keys=True, default=str), []).append(example)
    return {"+".join(path.stem for path in group): group for group in groups.values()}


def fan_out(group: list[Path]) -> PipelineSpec:
    """One pipeline of the group's shared source and transform, with every example's sinks, each labelled by its file
    (and its own label, for an example of several sinks)."""
    specs = [load_pipeline(example) for example in group]
    sinks = [sink.model_copy(update={"label": path.stem if len(spec.sink_specs) == 1 else f"{path.stem}.{sink.name}"})
             for path, spec in zip(group, specs, strict=True) for sink in spec.sink_specs]  # fmt: skip
    return specs[0].model_copy(update={"name": "examples", "sink": None, "sinks": sinks})


GROUPS = example_groups(EXAMPLES)


def test_every_example_is_covered() -> None:
    names = {path.name for path in EXAMPLES}
    assert {"orders_to_delta_merge.toml", "orders_to_postgres.toml", "customer_totals_to_postgres.toml",
            "orders_to_kafka.toml", "orders_to_files.toml"} <= names  # fmt: skip
    assert sorted(path for group in GROUPS.values() for path in group) == EXAMPLES  # each example runs, once
    assert len(GROUPS) < len(EXAMPLES)  # some share a pipeline


@pytest.mark.parametrize("group", GROUPS)
def test_example_runs_and_reconciles(
    group: str, streamproof_prover: Prover, streamproof_postgres: PostgresServer
) -> None:
    spec = on_test_servers(fan_out(GROUPS[group]), streamproof_prover.broker.bootstrap_servers, streamproof_postgres)
    report = streamproof_prover.prove(spec, events=4_000, crash_at=(), batch_size=2_000)
    reports = streamproof_prover.proofs[-1].reports
    assert [sink_report.sink for sink_report in reports] == [sink.name for sink in spec.sink_specs]
    assert reports[0] is report
    for sink_report in reports:
        assert sink_report.source_records == 4_000, sink_report.to_dict()
        assert (sink_report.lost, sink_report.duplicated, sink_report.unexpected) == (0, 0, 0), sink_report.to_dict()
        assert sink_report.identity_holds and sink_report.sink_records > 0 and sink_report.quarantined > 0, (
            sink_report.to_dict()
        )
    # The independent checker (no Spark, its own parsing and readers) agrees term by term.
    run = load_pipeline(streamproof_prover.workdir / f"proof-{len(streamproof_prover.proofs)}" / "pipeline.toml")
    assert disagreements(reports, verify_independently(run)) == []


def test_partitioned_example_survives_kills_mid_write_and_compacts_per_partition(
    streamproof_prover: Prover, spark: object
) -> None:
    """Both partitioned tables (append by event date, MERGE by a bucket of the key) 0 lost / 0 duplicated through a
    SIGKILL in the middle of the MERGE's write, which prunes to the batch's partitions (a Delta append killed in its
    write: test_proof_matrix.py); then ``maintain --optimize`` compacts the chosen partitions only
    (Z-ordered by customer), and the data reconciles the same afterwards."""
    from streamproof.maintenance import maintain

    spec = load_pipeline(REPO / "examples" / "orders_partitioned_to_delta.toml")
    kills = ("mid-sink-write:latest-by-bucket",)
    streamproof_prover.prove(spec, events=3_000, crash_at=kills, batch_size=750)
    reports = streamproof_prover.proofs[-1].reports
    assert [report.sink for report in reports] == ["events-by-date", "latest-by-bucket"]
    for report in reports:
        assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0), report.to_dict()
        assert report.identity_holds and report.sink_records > 0, report.to_dict()
    run = load_pipeline(streamproof_prover.workdir / f"proof-{len(streamproof_prover.proofs)}" / "pipeline.toml")
    assert disagreements(reports, verify_independently(run)) == []

    by_date, by_bucket, quarantine = (str(run.resolve_path(path)) for path in
                                      (*(sink.folder for sink in run.sink_specs), run.quarantine_path))  # fmt: skip
    lines = list(maintain(spark, run, compact=True, vacuum_hours=None,  # type: ignore[arg-type]
                          where="order_bucket IN (0, 1)"))  # fmt: skip
    assert lines[0].startswith(f"{by_date}: OPTIMIZE skipped: --where 'order_bucket IN (0, 1)': "), lines
    assert re.fullmatch(rf"{re.escape(by_bucket)}: OPTIMIZE removed \d+ files, added \d+(, in [12] partitions?)?",
                        lines[1]), lines  # fmt: skip
    assert lines[2] == f"{quarantine}: not partitioned, --where does not apply: OPTIMIZE skipped", lines
    lines = list(maintain(spark, run, compact=True, vacuum_hours=None))  # type: ignore[arg-type]
    assert re.fullmatch(rf"{re.escape(by_date)}: OPTIMIZE ZORDER BY \(customer_id\) removed \d+ files, added "
                        r"\d+, in \d+ partitions?", lines[0]), lines  # fmt: skip
    assert lines[1].startswith(f"{by_bucket}: OPTIMIZE removed ") and lines[2].startswith(f"{quarantine}: OPTIMIZE")
    assert disagreements(reports, verify_independently(run)) == []  # the compacted tables hold the same rows
