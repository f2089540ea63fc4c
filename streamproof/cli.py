"""``streamproof ...``: the command line of DESIGN.md.

Exit codes: 0 success; 1 a verification or proof found loss or duplicates; 2 bad input (config,
arguments, missing set-up). A predictable mistake prints one ``error:`` line, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from streamproof import maintenance
from streamproof.bench.runner import BENCHMARKS, check_request, run_on_local_servers, summary_lines, write_results
from streamproof.bench.scaling import plot_scaling
from streamproof.checkpoint.folder import backup, restore
from streamproof.checkpoint.log import batch_end_offsets, committed_batches, logged_batches
from streamproof.checkpoint.recover import recover
from streamproof.config import PipelineSpec, load_pipeline
from streamproof.demo import run_demo
from streamproof.errors import ConfigError, StreamproofError, first_line
from streamproof.faults import NAMED_POINTS
from streamproof.generator import EventMix
from streamproof.generator import generate as produce
from streamproof.harness.matrix import run_matrix, upstream_shares
from streamproof.harness.proof import prove_pipeline
from streamproof.infra import KafkaBroker, PostgresServer, default_state_dir
from streamproof.pipeline.events import Event, RunSummary
from streamproof.pipeline.query import run as run_pipeline
from streamproof.reconcile import reports_document, verify_pipeline
from streamproof.render import matrix_html, matrix_table, print_reports, report_html
from streamproof.session import build_session
from streamproof.sinks import open_sinks

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Exactly-once Kafka -> Spark -> Delta pipelines, and the proof.",
)
infra_app = typer.Typer(no_args_is_help=True, help="Local Apache Kafka (KRaft) and PostgreSQL for pipelines and tests.")
app.add_typer(infra_app, name="infra")
checkpoint_app = typer.Typer(no_args_is_help=True, help="Inspect, back up, restore or rebuild a pipeline's checkpoint.")
app.add_typer(checkpoint_app, name="checkpoint")

# Off a terminal (CI logs, pipes) rich would wrap at 80 columns and split the per-batch lines.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 120)
error_console = Console(stderr=True, highlight=False, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])

StateDir = Annotated[Path | None, typer.Option("--state-dir", help="State folder (default .streamproof).")]


def friendly_errors(command: F) -> F:
    """Turn streamproof's own errors and predictable Spark failures into one line and an exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except StreamproofError as error:
            error_console.print(f"error: {error}", markup=False)
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            error_console.print("interrupted")
            raise typer.Exit(130) from None
        except Exception as error:  # Spark/Py4J errors: the first line says what happened
            if type(error).__module__.startswith(("pyspark", "py4j")):
                error_console.print(f"error: Spark: {first_line(error, limit=400)}", markup=False)
                raise typer.Exit(1) from None
            raise

    return wrapper  # type: ignore[return-value]


def _state_dir(state_dir: Path | None) -> Path:
    return state_dir.resolve() if state_dir else default_state_dir()


@infra_app.command("up")
@friendly_errors
def infra_up(
    port: Annotated[int, typer.Option(help="Kafka client port on 127.0.0.1.")] = 9092,
    controller_port: Annotated[int, typer.Option(help="KRaft controller port on 127.0.0.1.")] = 9093,
    postgres: Annotated[bool, typer.Option("--postgres", help="Also start a local PostgreSQL 15.")] = False,
    pg_port: Annotated[int, typer.Option(help="PostgreSQL port on 127.0.0.1.")] = 5432,
    state_dir: StateDir = None,
) -> None:
    """Start the local Kafka broker, and PostgreSQL with --postgres (idempotent: running ones are reused)."""
    console.print(KafkaBroker(_state_dir(state_dir), port, controller_port).up())
    if postgres:
        console.print(PostgresServer(_state_dir(state_dir), pg_port).up())


@infra_app.command("down")
@friendly_errors
def infra_down(
    wipe: Annotated[bool, typer.Option(help="Also delete the broker's (and database's) data.")] = False,
    state_dir: StateDir = None,
) -> None:
    """Stop the broker (and PostgreSQL) that `infra up` started (only those)."""
    console.print(KafkaBroker(_state_dir(state_dir)).down(wipe=wipe))
    server = PostgresServer(_state_dir(state_dir))
    if server.home.exists():
        console.print(server.down(wipe=wipe))


@infra_app.command("status")
@friendly_errors
def infra_status(state_dir: StateDir = None) -> None:
    """Show whether the local broker (and PostgreSQL) run and answer."""
    console.print(KafkaBroker(_state_dir(state_dir)).status())
    server = PostgresServer(_state_dir(state_dir))
    if server.home.exists():
        console.print(server.status())


def _fraction(name: str) -> Callable[[float | None], float | None]:
    def check(value: float | None) -> float | None:
        if value is not None and not 0.0 <= value <= 1.0:
            raise typer.BadParameter(f"{value} is not a fraction between 0 and 1", param_hint=name)
        return value

    return check


@app.command()
@friendly_errors
def generate(
    topic: Annotated[str, typer.Option(help="Topic to produce into (created if missing).")],
    count: Annotated[int, typer.Option(min=0, help="Number of records, duplicates included.")],
    partitions: Annotated[int, typer.Option(min=1, help="Partitions when creating the topic.")] = 4,
    malformed: Annotated[
        float, typer.Option(callback=_fraction("--malformed"), help="Share of invalid records (0..1).")
    ] = 0.0,
    duplicates: Annotated[
        float,
        typer.Option(callback=_fraction("--duplicates"), help="Share of resends of earlier events (0..1)."),
    ] = 0.0,
    late: Annotated[
        float, typer.Option(callback=_fraction("--late"), help="Share of events 6 hours behind the stream (0..1).")
    ] = 0.0,
    schema_change_at: Annotated[
        int | None,
        typer.Option(min=0, help="From this record on: a new field 'channel'; 1 in 20 sends amount as an object."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed: same seed, same records.")] = 42,
    bootstrap_servers: Annotated[str, typer.Option(help="Kafka bootstrap servers.")] = "127.0.0.1:9092",
    state_dir: StateDir = None,
) -> None:
    """Produce deterministic JSON order events (idempotent producer, acks=all)."""
    with Progress(
        TextColumn("generating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("generate", total=count)
        mix = EventMix(seed=seed, malformed=malformed, duplicates=duplicates, late=late,
                       schema_change_at=schema_change_at)  # fmt: skip
        result = produce(bootstrap_servers, topic, count, partitions=partitions,
                         manifest_dir=_state_dir(state_dir) / "generated",
                         on_progress=lambda done: progress.update(task, completed=done), **mix)  # fmt: skip
    console.print(
        f"produced {result.count:,} events to {topic} ({result.partitions} partitions) in {result.seconds:.1f} s: "
        f"{result.records_per_second:,.0f} records/s; malformed {result.malformed:,} {result.malformed_by_kind or ''}"
        + (f"; duplicates {result.duplicates:,}" if duplicates else "")
        + (f"; late {result.late:,}" if late else "")
    )


@app.command()
@friendly_errors
def run(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline file (TOML).")],
    available_now: Annotated[bool, typer.Option("--available-now", help="Drain what is there, then exit.")] = False,
    max_batches: Annotated[int | None, typer.Option(min=1, help="Stop after this many batches.")] = None,
) -> None:
    """Run a pipeline; SIGTERM or Ctrl-C stops it cleanly after the current batch."""
    spec = load_pipeline(pipeline)
    if console.is_terminal:
        summary = _run_with_live_status(spec, available_now=available_now, max_batches=max_batches)
    else:
        summary = run_pipeline(spec, available_now=available_now, max_batches=max_batches, on_event=_print_event)
    console.print(summary.line(), markup=False)


def _print_event(event: Event) -> None:
    console.print(event.line(), markup=False)


def _run_with_live_status(spec: PipelineSpec, *, available_now: bool, max_batches: int | None) -> RunSummary:
    """On a terminal: the batch lines scroll, and a status line below them shows the run so far."""
    started = time.monotonic()
    seen = RunSummary(spec.name)

    def status() -> Text:
        lag = "?" if seen.last_lag is None else f"{seen.last_lag:,}"
        return Text(
            f"{spec.name}: {seen.batches} batches, {seen.rows_in:,} rows in, {seen.rows_out:,} to sink, "
            f"{seen.quarantined:,} quarantined, last batch {seen.last_rate:,.0f} rows/s, kafka lag {lag}, "
            f"{time.monotonic() - started:,.0f} s",
            style="bold",
        )

    with Live(status(), console=console, refresh_per_second=2, transient=True) as live:

        def show(event: Event) -> None:
            _print_event(event)
            live.update(status())

        summary = run_pipeline(spec, available_now=available_now, max_batches=max_batches, on_event=show,
                               summary=seen)  # fmt: skip
    return summary


@app.command()
@friendly_errors
def verify(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline file (TOML).")],
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
    html_file: Annotated[Path | None, typer.Option("--html", help="Write an HTML page here.")] = None,
    state_dir: StateDir = None,
) -> None:
    """Reconcile the topic against the sink and quarantine tables; exit 1 on loss or duplicates."""
    spec = load_pipeline(pipeline)
    spark = build_session(spec.spark, app_name=f"streamproof-verify:{spec.name}")
    reports = verify_pipeline(spark, spec, manifest_dir=_state_dir(state_dir) / "generated")
    print_reports(console, reports)
    _write(json_file, json.dumps(reports_document(reports), indent=2))
    _write(html_file, report_html(reports, command="streamproof verify " + " ".join(sys.argv[2:])))
    if not all(report.ok for report in reports):
        raise typer.Exit(1)


@app.command()
@friendly_errors
def prove(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline file (TOML).")],
    matrix: Annotated[bool, typer.Option("--matrix", help="Every guarantee x every crash point.")] = False,
    crash_at: Annotated[
        list[str] | None,
        typer.Option(
            "--crash-at",
            help="Crash point(s), repeatable or comma-separated: "
            + ", ".join(NAMED_POINTS)
            + "; mid-sink-write:<sink label> picks a sink of a fan-out",
        ),
    ] = None,
    random_kills: Annotated[int | None, typer.Option(min=0, help="SIGKILLs at seeded random moments.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the kill moments and of the matrix data.")] = 1,
    count: Annotated[int, typer.Option(min=100, help="Events per matrix cell.")] = 50_000,
    malformed: Annotated[
        float, typer.Option(callback=_fraction("--malformed"), help="Malformed share of the matrix data.")
    ] = 0.005,
    duplicates: Annotated[
        float | None,
        typer.Option(callback=_fraction("--duplicates"), help="Resent share of matrix data (0.02 if dedup, else 0)."),
    ] = None,
    late: Annotated[
        float | None,
        typer.Option(callback=_fraction("--late"), help="Late share of matrix data (0.01 if dedup, else 0)."),
    ] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the result as JSON here.")] = None,
    html_file: Annotated[Path | None, typer.Option("--html", help="Write an HTML page here.")] = None,
    state_dir: StateDir = None,
) -> None:
    """Crash the pipeline (SIGKILL of its process group), restart it until drained, reconcile.

    Exit 1 when an exactly-once run loses or duplicates anything.
    """
    chosen = [bool(matrix), crash_at is not None, random_kills is not None]
    if sum(chosen) > 1:
        raise ConfigError("choose one of --matrix, --crash-at, --random-kills")
    spec = load_pipeline(pipeline)
    state = _state_dir(state_dir)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    command = "streamproof prove " + " ".join(sys.argv[2:])
    if matrix:
        _prove_matrix(pipeline, spec, state / "matrix" / stamp, count, malformed, seed, json_file, html_file, command,
                      upstream_shares(spec, duplicates, late))  # fmt: skip
        return
    points = [point.strip() for value in crash_at or [] for point in value.split(",") if point.strip()]
    proof = prove_pipeline(pipeline, crash_at=points, random_kills=0 if points else (random_kills or 2), seed=seed,
                           log_dir=state / "logs" / stamp, emit=_emit_plain,
                           manifest_dir=state / "generated")  # fmt: skip
    print_reports(console, proof.reports)
    _write(json_file, json.dumps(reports_document(proof.reports), indent=2))
    _write(html_file, report_html(proof.reports, proof.harness.timeline, command))
    if not proof.ok:
        raise typer.Exit(1)


def _prove_matrix(pipeline: Path, spec: PipelineSpec, workdir: Path, count: int, malformed: float, seed: int,
                  json_file: Path | None, html_file: Path | None, command: str,
                  upstream: dict[str, float]) -> None:  # fmt: skip
    spark = build_session(spec.spark, app_name=f"streamproof-matrix:{spec.name}")
    started = time.monotonic()
    cells = run_matrix(pipeline, spark, workdir=workdir, count=count, malformed=malformed, seed=seed, emit=_emit_plain,
                       duplicates=upstream["duplicates"], late=upstream["late"])  # fmt: skip
    console.print(matrix_table(cells))
    console.print(f"matrix: {len(cells)} cells in {time.monotonic() - started:.0f} s; cells under {workdir}")
    _write(json_file, json.dumps({"command": command, "cells": [cell.to_dict() for cell in cells]}, indent=2))
    _write(html_file, matrix_html(cells, command))
    if any(cell.exactly_once and cell.outcome != "clean" for cell in cells):
        raise typer.Exit(1)


def _emit_plain(line: str) -> None:
    console.print(line, markup=False)


def _write(path: Path | None, text: str) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        console.print(f"wrote {path}")


PipelineFile = Annotated[Path, typer.Argument(help="Pipeline file (TOML).")]


@checkpoint_app.command("show")
@friendly_errors
def checkpoint_show(
    pipeline: PipelineFile,
    last: Annotated[int, typer.Option(min=1, help="How many of the newest batches to list.")] = 20,
) -> None:
    """Per batch: the offsets Spark logged and whether it committed; beside it, each sink's last batch."""
    spec = load_pipeline(pipeline)
    logged, committed = logged_batches(spec.checkpoint_dir), set(committed_batches(spec.checkpoint_dir))
    table = Table(title=f"checkpoint {spec.checkpoint_dir}")
    for column in ("batch", "end offsets (topic: partition=offset)", "committed"):
        table.add_column(column)
    for batch_id in logged[-last:]:
        try:
            offsets = _offsets_text(batch_end_offsets(spec.checkpoint_dir, batch_id))
        except StreamproofError as error:
            offsets = f"[red]{error}[/]"
        table.add_row(str(batch_id), offsets, "yes" if batch_id in committed else "[yellow]no (in flight)[/]")
    if not logged:
        table.add_row("-", "(empty: no batch was ever planned here)", "-")
    console.print(table)
    spark = build_session(spec.spark, app_name=f"streamproof-checkpoint:{spec.name}")
    sinks = Table(title="what the sinks hold")
    for column in ("sink", "where", "last batch", "its end offsets"):
        sinks.add_column(column)
    for sink in open_sinks(spec):
        head = sink.last_commit(spark)
        sinks.add_row(sink.name, sink.location, "-" if head is None else str(head.batch_id),
                      "-" if head is None or head.end_offsets is None else _offsets_text(head.end_offsets))  # fmt: skip
    console.print(sinks)


def _offsets_text(offsets: dict[str, dict[str, int]]) -> str:
    return "; ".join(
        f"{topic}: " + " ".join(f"{p}={o}" for p, o in sorted(parts.items(), key=lambda item: int(item[0])))
        for topic, parts in offsets.items()
    )


@checkpoint_app.command("backup")
@friendly_errors
def checkpoint_backup(
    pipeline: PipelineFile,
    to: Annotated[Path | None, typer.Option("--to", help="Backup folder (default: a stamped sibling).")] = None,
) -> None:
    """Copy the checkpoint; refused while a pipeline runs on it (the copy would not be consistent)."""
    spec = load_pipeline(pipeline)
    console.print(f"backed up {spec.checkpoint_dir} to {backup(spec.checkpoint_dir, to)}")


@checkpoint_app.command("restore")
@friendly_errors
def checkpoint_restore(
    pipeline: PipelineFile,
    source: Annotated[Path, typer.Option("--from", help="The backup folder to restore.")],
) -> None:
    """Replace the checkpoint by a backup (the current one is kept aside)."""
    spec = load_pipeline(pipeline)
    aside = restore(spec.checkpoint_dir, source)
    console.print(f"restored {spec.checkpoint_dir} from {source}" + (f"; the previous one is {aside}" if aside else ""))


@checkpoint_app.command("recover")
@friendly_errors
def checkpoint_recover(pipeline: PipelineFile) -> None:
    """Rebuild a lost or damaged checkpoint from the end offsets the sinks recorded with each batch."""
    spec = load_pipeline(pipeline)
    spark = build_session(spec.spark, app_name=f"streamproof-recover:{spec.name}")
    console.print(recover(spark, spec), markup=False)


@app.command()
@friendly_errors
def maintain(
    pipeline: PipelineFile,
    do_optimize: Annotated[bool, typer.Option("--optimize", help="Compact small files (OPTIMIZE).")] = False,
    vacuum_hours: Annotated[
        float | None, typer.Option("--vacuum", help="Delete files unreferenced for longer than HOURS (VACUUM).")
    ] = None,
    allow_short_retention: Annotated[
        bool, typer.Option("--allow-short-retention", help="Allow --vacuum below 168 hours (no reader needs them).")
    ] = False,
) -> None:
    """OPTIMIZE and/or VACUUM the pipeline's Delta tables (its Delta sinks and its quarantine table)."""
    maintenance.check_request(compact=do_optimize, vacuum_hours=vacuum_hours,
                              allow_short_retention=allow_short_retention)  # fmt: skip
    spec = load_pipeline(pipeline)
    spark = build_session(spec.spark, app_name=f"streamproof-maintain:{spec.name}")
    for line in maintenance.maintain(spark, spec, compact=do_optimize, vacuum_hours=vacuum_hours,
                                     allow_short_retention=allow_short_retention):  # fmt: skip
        console.print(line, markup=False)


@app.command()
@friendly_errors
def demo(
    count: Annotated[int, typer.Option(min=1000, help="Events to generate.")] = 1_000_000,
    kills: Annotated[int, typer.Option(min=0, help="Random SIGKILLs during the run.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the data and of the kill moments.")] = 7,
    state_dir: StateDir = None,
) -> None:
    """The whole story on embedded defaults: Kafka up, 1M events, exactly-once through SIGKILLs, proof."""
    report = run_demo(console, _state_dir(state_dir), count=count, kills=kills, seed=seed)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
@friendly_errors
def bench(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            help="throughput, latency, recovery, sinks, scaling, tuning (default: all six).", show_default=False
        ),
    ] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Also write the results to this file.")] = None,
    events: Annotated[int, typer.Option(help="Events of the throughput data (scaling: half, this, twice).")] = (
        2_000_000
    ),
    rate: Annotated[int, typer.Option(min=1, help="latency: events/s of the steady producer.")] = 20_000,
    seconds: Annotated[float, typer.Option(min=1, help="latency: seconds of steady production.")] = 60.0,
    rounds: Annotated[int, typer.Option(min=1, help="throughput: runs of each pipeline (the fastest is kept).")] = 2,
    plot: Annotated[Path | None, typer.Option("--plot", help="scaling: draw rows/s per batch into this PNG.")] = None,
    bootstrap_servers: Annotated[
        str | None, typer.Option(help="Use this Kafka instead of the local one (started and stopped if needed).")
    ] = None,
    results_dir: Annotated[Path, typer.Option(help="Folder of the results JSON.")] = Path("benchmarks/results"),
    state_dir: StateDir = None,
) -> None:
    """Benchmarks with ratios against baselines of the same run; JSON in benchmarks/results/."""
    chosen = names or list(BENCHMARKS)
    check_request(chosen, events)
    if plot is not None and "scaling" not in chosen:
        raise ConfigError("--plot draws the scaling benchmark: add `scaling` to the benchmarks to run")
    options = {"latency": {"rate": rate, "seconds": seconds}, "throughput": {"rounds": rounds}}
    document = run_on_local_servers(chosen, state_dir=_state_dir(state_dir), bootstrap=bootstrap_servers,
                                    events=events, emit=_emit_plain, options=options)  # fmt: skip
    path = write_results(document, results_dir, json_file)
    if plot is not None:
        console.print(f"plot written to {plot_scaling(document, plot)}")
    for line in summary_lines(document):
        console.print(line, markup=False)
    console.print(f"results written to {path}")


def main() -> None:
    """Console-script entry point."""
    app(prog_name="streamproof")


if __name__ == "__main__":
    main()
