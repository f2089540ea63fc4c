"""``streamproof checkpoint show|backup|restore|recover|rewind``, ``maintain``, ``bench``: looking after a pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from streamproof.checkpoint.copies import backup, restore
from streamproof.checkpoint.log import batch_end_offsets, committed_batches, logged_batches
from streamproof.cli.base import (
    PipelineFile,
    StateDir,
    app,
    checkpoint_app,
    console,
    emit_plain,
    friendly_errors,
    state_path,
)
from streamproof.config import PipelineSpec, load_pipeline
from streamproof.errors import ConfigError, StreamproofError
from streamproof.storage.location import Location


@checkpoint_app.command("show")
@friendly_errors
def checkpoint_show(
    pipeline: PipelineFile,
    last: Annotated[int, typer.Option(min=1, help="How many of the newest batches to list.")] = 20,
) -> None:
    """Per batch: the offsets Spark logged and whether it committed; beside it, each sink's last batch."""
    from streamproof.jvm.session import local_session
    from streamproof.sinks import open_sinks

    spec = load_pipeline(pipeline)
    sinks_list = open_sinks(spec)
    # A JVM only where a file is reached through Hadoop's FileSystem (HDFS, object stores): a local look is instant.
    needs_jvm = spec.on_distributed_storage or any(sink.needs_spark_for_commits() for sink in sinks_list)
    spark = local_session(spec.spark, app_name=f"streamproof-checkpoint:{spec.name}") if needs_jvm else None
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
    sinks = Table(title="what the sinks hold")
    for column in ("sink", "where", "last batch", "its end offsets"):
        sinks.add_column(column)
    for sink in sinks_list:
        head = sink.last_commit(spark)
        sinks.add_row(
            sink.name,
            sink.location,
            "-" if head is None else str(head.batch_id),
            "-" if head is None or head.end_offsets is None else _offsets_text(head.end_offsets),
        )
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
    to: Annotated[str | None, typer.Option("--to", help="Backup folder or URI (default: a stamped sibling).")] = None,
) -> None:
    """Copy the checkpoint; refused while a pipeline runs on it (the copy would not be consistent)."""

    spec = load_pipeline(pipeline)
    _session_for_storage(spec, to)
    target = None if to is None else Location.resolved(to)
    console.print(f"backed up {spec.checkpoint_dir} to {backup(spec.checkpoint_dir, target)}")


@checkpoint_app.command("restore")
@friendly_errors
def checkpoint_restore(
    pipeline: PipelineFile,
    source: Annotated[str, typer.Option("--from", help="The backup folder (or URI) to restore.")],
) -> None:
    """Replace the checkpoint by a backup (the current one is kept aside)."""

    spec = load_pipeline(pipeline)
    _session_for_storage(spec, source)
    aside = restore(spec.checkpoint_dir, Location.resolved(source))
    console.print(f"restored {spec.checkpoint_dir} from {source}" + (f"; the previous one is {aside}" if aside else ""))


def _session_for_storage(spec: PipelineSpec, *others: str | None) -> None:
    """A checkpoint (or a backup) on distributed storage is reached through Spark's JVM: start the session."""
    from streamproof.jvm.session import local_session

    if spec.checkpoint_dir.is_remote or any(other and Location(other).is_remote for other in others):
        local_session(spec.spark, app_name=f"streamproof-checkpoint:{spec.name}")


@checkpoint_app.command("recover")
@friendly_errors
def checkpoint_recover(pipeline: PipelineFile) -> None:
    """Rebuild a lost or damaged checkpoint from the end offsets the sinks recorded with each batch."""
    from streamproof.checkpoint.recover import recover
    from streamproof.jvm.session import local_session

    spec = load_pipeline(pipeline)
    spark = local_session(spec.spark, app_name=f"streamproof-recover:{spec.name}")
    console.print(recover(spark, spec), markup=False)


@checkpoint_app.command("rewind")
@friendly_errors
def checkpoint_rewind(pipeline: PipelineFile) -> None:
    """Replay the batches a sink lost (storage gone backwards): the checkpoint goes back to that sink's last batch
    and every batch after it runs again with its original id and offsets; the other sinks skip them."""
    from streamproof.checkpoint.positions import rewind
    from streamproof.checkpoint.start import quarantine_table
    from streamproof.jvm.session import build_session
    from streamproof.pipeline.query import run as run_pipeline
    from streamproof.sinks import open_sinks

    spec = load_pipeline(pipeline)
    spark = None
    if any(sink.needs_spark_for_commits() for sink in [*open_sinks(spec), quarantine_table(spec)]):
        spark = build_session(spec.spark, app_name=f"streamproof-rewind:{spec.name}")

    def replay(spec: PipelineSpec) -> None:
        run_pipeline(spec, once=True, on_event=lambda event: emit_plain(event.line()) if event.shown else None)

    console.print(rewind(spec, replay, spark), markup=False)


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
    where: Annotated[
        str | None,
        typer.Option("--where", help="--optimize only the partitions this predicate on partition columns selects."),
    ] = None,
) -> None:
    """OPTIMIZE and/or VACUUM the pipeline's Delta tables (its Delta sinks and its quarantine table); OPTIMIZE
    compacts within each partition and Z-orders by the sink's ``zorder_by``."""
    from streamproof import maintenance
    from streamproof.jvm.session import build_session

    spec = load_pipeline(pipeline)
    maintenance.check_request(
        compact=do_optimize,
        vacuum_hours=vacuum_hours,
        allow_short_retention=allow_short_retention,
        where=where,
        spec=spec,
    )
    spark = build_session(spec.spark, app_name=f"streamproof-maintain:{spec.name}")
    for line in maintenance.maintain(
        spark,
        spec,
        compact=do_optimize,
        vacuum_hours=vacuum_hours,
        allow_short_retention=allow_short_retention,
        where=where,
    ):
        console.print(line, markup=False)


@app.command()
@friendly_errors
def bench(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            help="throughput, latency, recovery, sinks, scaling, tuning (default: these six); partitioned (a "
            "partitioned Delta table against the same unpartitioned); cluster (on the cluster of `infra up "
            "--spark-workers 2`); age (a sink of 50,000 commits against a young one; on HDFS too under `infra up "
            "--hdfs`, on S3 under `infra up --s3`, its requests counted).",
            show_default=False,
        ),
    ] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Also write the results to this file.")] = None,
    events: Annotated[int, typer.Option(help="Events of the throughput data (scaling: half, this, twice).")] = (
        2_000_000
    ),
    rate: Annotated[int, typer.Option(min=1, help="latency: events/s of the steady producer.")] = 20_000,
    seconds: Annotated[float, typer.Option(min=1, help="latency: seconds of steady production.")] = 60.0,
    rounds: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="throughput: interleaved rounds of each side, the medians kept (default 3); age: runs of each "
            "pipeline, the fastest kept (default 2).",
            show_default=False,
        ),
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="scaling: draw rows/s per batch into this PNG.")] = None,
    bootstrap_servers: Annotated[
        str | None, typer.Option(help="Use this Kafka instead of the local one (started and stopped if needed).")
    ] = None,
    results_dir: Annotated[Path, typer.Option(help="Folder of the results JSON.")] = Path("benchmarks/results"),
    state_dir: StateDir = None,
) -> None:
    """Benchmarks with ratios against baselines of the same run; JSON in benchmarks/results/."""
    from streamproof.bench.runner import (
        DEFAULT_BENCHMARKS,
        check_request,
        run_on_local_servers,
        summary_lines,
        write_results,
    )
    from streamproof.bench.scaling import plot_scaling
    from streamproof.bench.throughput import plot_throughput

    chosen = names or list(DEFAULT_BENCHMARKS)
    check_request(chosen, events)
    if plot is not None and "scaling" not in chosen:
        raise ConfigError("--plot draws the scaling benchmark: add `scaling` to the benchmarks to run")
    options = {
        "latency": {"rate": rate, "seconds": seconds},
        "throughput": {"rounds": rounds or 3, "state_dir": state_path(state_dir)},
        "age": {"rounds": rounds or 2, "state_dir": state_path(state_dir)},
        "cluster": {"state_dir": state_path(state_dir)},
    }
    document = run_on_local_servers(
        chosen,
        state_dir=state_path(state_dir),
        bootstrap=bootstrap_servers,
        events=events,
        emit=emit_plain,
        options=options,
    )
    path = write_results(document, results_dir, json_file)
    for beside in (path, json_file):  # each round's batches, drawn beside the JSON
        if beside is not None and (drawn := plot_throughput(document, beside.with_suffix(".png"))) is not None:
            console.print(f"batch durations drawn in {drawn}")
    if plot is not None:
        console.print(f"plot written to {plot_scaling(document, plot)}")
    for line in summary_lines(document):
        console.print(line, markup=False)
    console.print(f"results written to {path}")
