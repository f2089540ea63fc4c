"""``streamproof demo``: the whole story on embedded defaults, start to finish, leaving nothing running.

Kafka up (if not already) -> 1M order events with 0.1% malformed into a fresh topic -> the exactly-once
Kafka -> Delta pipeline run to the end through seeded random SIGKILLs and restarts -> reconciliation by both
checkers (Spark's, and the independent one without Spark), side by side -> a table on the terminal and a JSON
report in ``.streamproof/reports/`` -> Kafka down (if the demo started it). Each demo uses its own topic, tables
and checkpoint under ``.streamproof/demo/<stamp>/``, so running it twice never mixes data.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from streamproof.config import load_pipeline
from streamproof.errors import PipelineError
from streamproof.generator import generate
from streamproof.harness.random_kills import run_with_random_kills
from streamproof.infra import KafkaBroker, free_port, port_in_use
from streamproof.jvm.session import build_session
from streamproof.reconcile import Report, verify_pipeline
from streamproof.reconcile.independent import disagreements, verify_independently
from streamproof.render import checkers_table, print_reports

DEMO_PIPELINE = """\
# Written by streamproof; re-run the check with: streamproof verify {pipeline_file}
name = "{name}"
guarantee = "exactly-once"
checkpoint = "{workdir}/checkpoint"

[source]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
starting_offsets = "earliest"
max_offsets_per_trigger = {max_offsets}

[transform]
format = "json"
schema = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id"]
quarantine = "{workdir}/tables/orders_quarantine"

[sink]
kind = "delta"
path = "{workdir}/tables/orders"
mode = "append"
"""


def write_demo_pipeline(workdir: Path, topic: str, bootstrap: str, max_offsets: int, name: str = "demo-orders") -> Path:
    """Write the demo's pipeline (orders -> Delta, exactly-once) into ``workdir``; return its path.

    Checkpoint and tables live under ``workdir``, so each call makes a pipeline of its own.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    pipeline_file = workdir / "pipeline.toml"
    pipeline_file.write_text(
        DEMO_PIPELINE.format(
            pipeline_file=pipeline_file,
            name=name,
            workdir=workdir,
            bootstrap=bootstrap,
            topic=topic,
            max_offsets=max_offsets,
        )
    )
    return pipeline_file


def _demo_broker(console: Console, state_dir: Path) -> KafkaBroker:
    """The streamproof broker on 9092 if it runs or 9092 is free; else a demo broker on free ports."""
    broker = KafkaBroker(state_dir)
    if broker.running() or not any(port_in_use(p) for p in (broker.port, broker.controller_port)):
        return broker
    demo = KafkaBroker(state_dir / "demo-kafka", port=free_port(), controller_port=free_port())
    console.print(
        f"port {broker.port} or {broker.controller_port} is used by another program: "
        f"the demo starts its own broker on {demo.bootstrap_servers}"
    )
    return demo


def run_demo(
    console: Console,
    state_dir: Path,
    *,
    count: int,
    kills: int,
    seed: int,
    malformed: float = 0.001,
    partitions: int = 4,
) -> Report:
    """Run the demo and return its report (also written as JSON under ``state_dir/reports``)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    console.rule("1. Kafka")
    broker = _demo_broker(console, state_dir)
    started_here = not broker.running()
    console.print(broker.up())
    try:
        topic = f"demo-orders-{stamp}"
        console.rule(f"2. {count:,} order events, {malformed:.1%} malformed")
        generated = generate(
            broker.bootstrap_servers,
            topic,
            count,
            partitions=partitions,
            malformed=malformed,
            seed=seed,
            manifest_dir=state_dir / "generated",
        )
        console.print(
            f"produced {generated.count:,} events ({generated.malformed:,} malformed) into {topic} "
            f"in {generated.seconds:.1f} s: {generated.records_per_second:,.0f} records/s"
        )
        workdir = state_dir / "demo" / stamp
        # About ten batches, so that each random kill lands while a batch is being written.
        pipeline_file = write_demo_pipeline(workdir, topic, broker.bootstrap_servers, max(1000, count // 10))
        console.rule(f"3. exactly-once pipeline Kafka -> Delta, {kills} random SIGKILLs")
        harness = run_with_random_kills(
            pipeline_file,
            kills=kills,
            seed=seed,
            log_dir=workdir / "logs",
            emit=lambda line: console.print(line, markup=False),
        )
        console.rule("4. reconciliation, record by record")
        spec = load_pipeline(pipeline_file)
        checking = time.monotonic()
        spark = build_session(spec.spark, app_name="streamproof-demo-verify")
        try:
            (report,) = verify_pipeline(spark, spec, manifest_dir=state_dir / "generated")
        finally:
            spark.stop()
        seconds = {"spark": time.monotonic() - checking}
        report.crashes = [crash.to_dict() for crash in harness.crashes]
        print_reports(console, [report])
        console.rule("5. the same reconciliation again, without Spark (verify --independent)")
        checking = time.monotonic()
        (independent,) = verify_independently(spec)
        seconds["independent"] = time.monotonic() - checking
        console.print(checkers_table(report, independent))
        console.print(
            f"Spark checker: {report.verdict} in {seconds['spark']:.1f} s (with its session's start); "
            f"independent checker: {independent.verdict} in {seconds['independent']:.1f} s"
        )
        differ = disagreements([report], [independent])
        for line in differ:
            console.print(f"[bold red]the checkers disagree:[/] {line}")
        restarts = harness.restart_seconds
        console.print(
            f"pipeline: {harness.runs} runs, {harness.batches} batches, {harness.batch_rows_per_second:,.0f} rows/s "
            f"of batch time; {harness.wall_s:.0f} s wall including restarts"
            + (
                f"; seconds from kill to next committed batch: {', '.join(f'{r:.1f}' for r in restarts)}"
                if restarts
                else ""
            )
        )
        reports = state_dir / "reports"
        reports.mkdir(parents=True, exist_ok=True)
        report_file = reports / f"{stamp}.json"
        document = report.to_dict()
        document["independent"] = independent.to_dict()
        document["checkers_agree"] = not differ
        document["checker_seconds"] = {name: round(value, 1) for name, value in seconds.items()}
        if differ:  # two checkers that disagree prove nothing: the demo fails
            document["ok"] = False
        document["run"] = {
            "runs": harness.runs,
            "batches": harness.batches,
            "wall_s": round(harness.wall_s, 1),
            "batch_rows_per_second": round(harness.batch_rows_per_second),
            "pipeline_file": str(pipeline_file),
        }
        report_file.write_text(json.dumps(document, indent=2))
        console.print(f"report written to {report_file}")
        if differ:
            raise PipelineError(f"the two checkers disagree ({'; '.join(differ)}): report {report_file}")
        return report
    finally:
        if started_here:
            console.rule("6. Kafka down")
            console.print(broker.down())
