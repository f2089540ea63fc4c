"""``streamproof generate|run|verify|prove|demo``: data in, the pipeline run, its reconciliation and its proof."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from streamproof.cli.base import (
    StateDir,
    app,
    console,
    emit_plain,
    fraction,
    friendly_errors,
    state_path,
    write_output,
)
from streamproof.cli.jobs import (
    Inputs,
    JobArgs,
    JobState,
    Kafka,
    LocalRoot,
    Maps,
    Sandbox,
    ThenRecompute,
    Topics,
    is_job,
    job_maps,
    no_job_arguments,
    prove_job_command,
    run_job_command,
    verify_job_command,
)
from streamproof.config import PipelineSpec, dump_pipeline, load_pipeline
from streamproof.errors import ConfigError
from streamproof.faults.points import POINTS
from streamproof.harness.cluster import ClusterFaults
from streamproof.harness.sequence import parse_sequence
from streamproof.pipeline.events import Event, RunSummary


@app.command()
@friendly_errors
def run(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline file (TOML), or your job file (JOB.py).")],
    job_args: JobArgs = None,
    available_now: Annotated[bool, typer.Option("--available-now", help="Drain what is there, then exit.")] = False,
    max_batches: Annotated[int | None, typer.Option(min=1, help="Stop after this many batches.")] = None,
    master: Annotated[str | None, typer.Option(help="Run on this Spark master instead of [spark] master.")] = None,
    standby: Annotated[
        bool,
        typer.Option(
            "--standby",
            help="If the pipeline already runs (on this host): start warm and take over the "
            "moment it stops or dies, instead of refusing.",
        ),
    ] = False,
    warm_up: Annotated[
        bool,
        typer.Option(
            "--warm-up",
            help="Before reading the source, run the batch path on scratch copies of the checkpoint and tables "
            "(about half a minute), so that the first batches are not cold: for a process started ahead of its "
            "traffic.",
        ),
    ] = False,
    kafka: Kafka = None,
    maps: Maps = None,
    inputs: Inputs = None,
    topics: Topics = None,
    job_state: JobState = None,
    sandbox: Sandbox = None,
    local_root: LocalRoot = None,
    then_recompute: ThenRecompute = False,
    state_dir: StateDir = None,
) -> None:
    """Run a pipeline; SIGTERM or Ctrl-C stops it cleanly after the current batch. A job file (JOB.py) runs unchanged
    with its production addresses mapped (--kafka, --map, --topic), draining what the topic holds."""
    from streamproof.pipeline.query import run as run_pipeline
    from streamproof.pipeline.standby import run_standing_by

    if is_job(pipeline):
        job = job_maps(kafka, maps, inputs, topics)
        run_job_command(
            pipeline, job_args or [], job, state_dir, job_state, master, sandbox, local_root, then_recompute
        )
        return
    no_job_arguments(pipeline, job_args, kafka, maps)
    spec = load_pipeline(pipeline)
    spec = spec if master is None else spec.on_master(master)
    if console.is_terminal:
        summary = _run_with_live_status(
            spec, available_now=available_now, max_batches=max_batches, standby=standby, warm_up=warm_up
        )
    else:
        summary = (run_standing_by if standby else run_pipeline)(
            spec, available_now=available_now, max_batches=max_batches, on_event=_print_event, warm_up=warm_up
        )
    console.print(summary.line(), markup=False)


def _print_event(event: Event) -> None:
    if event.shown:
        console.print(event.line(), markup=False)


def _run_with_live_status(
    spec: PipelineSpec, *, available_now: bool, max_batches: int | None, standby: bool = False, warm_up: bool = False
) -> RunSummary:
    """On a terminal: the batch lines scroll, and a status line below them shows the run so far."""
    from streamproof.pipeline.query import run as run_pipeline
    from streamproof.pipeline.standby import run_standing_by

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

        summary = (run_standing_by if standby else run_pipeline)(
            spec, available_now=available_now, max_batches=max_batches, on_event=show, summary=seen, warm_up=warm_up
        )
    return summary


@app.command()
@friendly_errors
def verify(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline file (TOML), or your job file (JOB.py).")],
    job_args: JobArgs = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the report as JSON here.")] = None,
    html_file: Annotated[Path | None, typer.Option("--html", help="Write an HTML page here.")] = None,
    independent: Annotated[
        bool,
        typer.Option(
            "--independent",
            help="Without Spark or the pipeline's code: confluent-kafka, delta-rs, psycopg, "
            "pyarrow and the checker's own JSON parsing (docs/guarantees.md).",
        ),
    ] = False,
    kafka: Kafka = None,
    maps: Maps = None,
    inputs: Inputs = None,
    topics: Topics = None,
    state_dir: StateDir = None,
) -> None:
    """Reconcile the topic against the sink and quarantine tables. For a job file (JOB.py): what `streamproof run
    JOB.py` wrote against a crash-free twin of the job (--independent: both checkers, term by term).

    Exit 0: ok (nothing lost, duplicated or unexpected, every record accounted for); 1: damaged; 3: unknown (no
    damage found, but the counts do not add up: the report says why).
    """
    from streamproof.jvm.session import build_session
    from streamproof.reconcile import reports_document, verify_pipeline
    from streamproof.reconcile.independent import verify_independently
    from streamproof.reconcile.report import VERDICT_EXIT_CODES, worst_verdict
    from streamproof.render import print_reports, report_html

    if is_job(pipeline):
        job = job_maps(kafka, maps, inputs, topics)
        if not verify_job_command(pipeline, job_args or [], job, state_dir, json_file, independent):
            raise typer.Exit(1)
        return
    no_job_arguments(pipeline, job_args, kafka, maps)
    spec = load_pipeline(pipeline)
    started = time.monotonic()
    if independent:
        reports = verify_independently(spec)
    else:
        spark = build_session(spec.spark, app_name=f"streamproof-verify:{spec.name}")
        reports = verify_pipeline(spark, spec, manifest_dir=state_path(state_dir) / "generated")
    print_reports(console, reports)
    checker = "independent checker (no Spark)" if independent else "Spark checker"
    console.print(f"{checker}: {worst_verdict(reports)} in {time.monotonic() - started:.1f} s")
    write_output(json_file, json.dumps(reports_document(reports), indent=2))
    write_output(html_file, report_html(reports, command="streamproof verify " + " ".join(sys.argv[2:])))
    code = VERDICT_EXIT_CODES[worst_verdict(reports)]
    if code:
        raise typer.Exit(code)


@app.command()
@friendly_errors
def prove(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline file (TOML), or your job file (JOB.py).")],
    job_args: JobArgs = None,
    matrix: Annotated[bool, typer.Option("--matrix", help="Every guarantee x every crash point.")] = False,
    crash_at: Annotated[
        list[str] | None,
        typer.Option(
            "--crash-at",
            help="Crash point(s), repeatable or comma-separated: "
            + ", ".join(POINTS)
            + "; <point of a write>:<sink label> picks a sink of a fan-out; the last four need a cluster",
        ),
    ] = None,
    random_kills: Annotated[int | None, typer.Option(min=0, help="SIGKILLs at seeded random moments.")] = None,
    nemesis: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Steps of composed faults and operator actions (kills, restarts, backups, restores, "
            "lost checkpoint or commits) on a live stream, then both checkers; a failure is shortened.",
        ),
    ] = None,
    nemesis_replay: Annotated[
        str | None, typer.Option("--nemesis-replay", help="Replay one nemesis sequence as printed by a failed run.")
    ] = None,
    nemesis_resume: Annotated[
        Path | None,
        typer.Option("--nemesis-resume", help="Carry on a nemesis paused by SIGINT or SIGTERM (the folder it printed)"),
    ] = None,
    shrink_minutes: Annotated[
        float, typer.Option(min=0, help="How long a failing nemesis sequence may be shortened (minutes).")
    ] = 60.0,
    seed: Annotated[int, typer.Option(help="Seed of the kill moments, the nemesis and the matrix data.")] = 1,
    count: Annotated[int, typer.Option(min=100, help="Events per matrix cell.")] = 50_000,
    malformed: Annotated[
        float, typer.Option(callback=fraction("--malformed"), help="Malformed share of the matrix data.")
    ] = 0.005,
    duplicates: Annotated[
        float | None,
        typer.Option(callback=fraction("--duplicates"), help="Resent share of matrix data (0.02 if dedup, else 0)."),
    ] = None,
    late: Annotated[
        float | None,
        typer.Option(callback=fraction("--late"), help="Late share of matrix data (0.01 if dedup, else 0)."),
    ] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the result as JSON here.")] = None,
    html_file: Annotated[Path | None, typer.Option("--html", help="Write an HTML page here.")] = None,
    master: Annotated[str | None, typer.Option(help="Run on this Spark master instead of [spark] master.")] = None,
    kafka: Kafka = None,
    maps: Maps = None,
    inputs: Inputs = None,
    topics: Topics = None,
    independent: Annotated[
        bool,
        typer.Option(
            "--independent",
            help="JOB.py: compare every output again without Spark (delta-rs, pyarrow, confluent-kafka, psycopg): the "
            "two checkers must agree term by term.",
        ),
    ] = False,
    state_dir: StateDir = None,
) -> None:
    """Crash the pipeline (SIGKILL of its process group; on a cluster, of its machines too), restart it until
    drained, reconcile.

    Exit 1 when an exactly-once run loses or duplicates anything, or a fault left no evidence; with --matrix, when
    any cell is not as expected (a weaker guarantee's cell that shows none of its damage is a blind harness); with
    --nemesis, when a sequence ends in damage or in a refusal the docs do not list (its shortest form is printed to
    replay). A nemesis paused by SIGINT or SIGTERM (after the step in progress) exits 3 and prints how to carry on.
    """
    from streamproof.harness.cluster import cluster_faults
    from streamproof.harness.matrix import upstream_shares
    from streamproof.harness.proof import prove_pipeline
    from streamproof.reconcile import reports_document
    from streamproof.render import print_reports, report_html

    chosen = [
        bool(matrix),
        crash_at is not None,
        random_kills is not None,
        nemesis is not None,
        nemesis_replay is not None,
        nemesis_resume is not None,
    ]
    if sum(chosen) > 1:
        raise ConfigError(
            "choose one of --matrix, --crash-at, --random-kills, --nemesis, --nemesis-replay, --nemesis-resume"
        )
    if is_job(pipeline):
        points = [point.strip() for value in crash_at or [] for point in value.split(",") if point.strip()]
        job = job_maps(kafka, maps, inputs, topics)
        if not prove_job_command(
            pipeline, job_args or [], job, state_dir, points or None, master, json_file, independent
        ):
            raise typer.Exit(1)
        return
    no_job_arguments(pipeline, job_args, kafka, maps)
    spec = load_pipeline(pipeline)
    state = state_path(state_dir)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if master is not None:  # the runs read a pipeline file: this one, on the other master
        spec = spec.on_master(master)
        pipeline = state / "logs" / stamp / "pipeline-on-master.toml"
        pipeline.parent.mkdir(parents=True, exist_ok=True)
        pipeline.write_text(dump_pipeline(spec))
    command = "streamproof prove " + " ".join(sys.argv[2:])
    if nemesis is not None or nemesis_replay is not None or nemesis_resume is not None:
        workdir = nemesis_resume or state / "nemesis" / stamp
        _prove_nemesis(
            pipeline,
            spec,
            state,
            workdir,
            nemesis,
            nemesis_replay,
            seed,
            shrink_minutes,
            resume=nemesis_resume is not None,
        )
        return
    if matrix:
        _prove_matrix(
            pipeline,
            spec,
            state / "matrix" / stamp,
            count,
            malformed,
            seed,
            json_file,
            html_file,
            command,
            upstream_shares(spec, duplicates, late),
            cluster_faults(state),
        )
        return
    points = [point.strip() for value in crash_at or [] for point in value.split(",") if point.strip()]
    proof = prove_pipeline(
        pipeline,
        crash_at=points,
        random_kills=0 if points else (random_kills or 2),
        seed=seed,
        log_dir=state / "logs" / stamp,
        emit=emit_plain,
        manifest_dir=state / "generated",
        cluster=cluster_faults(state),
    )
    print_reports(console, proof.reports)
    for line in proof.missed:
        console.print(f"[bold red]fault missed[/] (the proof fails: a fault that never fired proves nothing): {line}")
    for line in proof.unread:
        console.print(f"[bold red]not drained[/] (the proof fails: records never read prove nothing): {line}")
    document = reports_document(proof.reports)
    if proof.missed or proof.unread:  # DESIGN's report, with why it fails when a fault did not happen
        document |= {"missed": proof.missed + proof.unread, "ok": False}
    write_output(json_file, json.dumps(document, indent=2))
    write_output(html_file, report_html(proof.reports, proof.harness.timeline, command))
    if not proof.ok:
        raise typer.Exit(1)


def _prove_matrix(
    pipeline: Path,
    spec: PipelineSpec,
    workdir: Path,
    count: int,
    malformed: float,
    seed: int,
    json_file: Path | None,
    html_file: Path | None,
    command: str,
    upstream: dict[str, float],
    cluster: ClusterFaults | None,
) -> None:
    from streamproof.harness.cells import cells_not_as_expected
    from streamproof.harness.matrix import run_matrix
    from streamproof.jvm.session import local_session
    from streamproof.render import matrix_html, matrix_table

    spark = local_session(spec.spark, app_name=f"streamproof-matrix:{spec.name}")  # beside the cells' runs
    started = time.monotonic()
    cells = run_matrix(
        pipeline,
        spark,
        workdir=workdir,
        count=count,
        malformed=malformed,
        seed=seed,
        emit=emit_plain,
        duplicates=upstream["duplicates"],
        late=upstream["late"],
        cluster=cluster,
    )
    console.print(matrix_table(cells))
    console.print(f"matrix: {len(cells)} cells in {time.monotonic() - started:.0f} s; cells under {workdir}")
    failures = cells_not_as_expected(cells)
    document = {
        "command": command,
        "cells": [cell.to_dict() for cell in cells],
        "ok": not failures,
        "not_as_expected": failures,
    }
    write_output(json_file, json.dumps(document, indent=2))
    write_output(html_file, matrix_html(cells, command))
    if failures:
        console.print(
            f"[bold red]matrix failed[/]: {len(failures)} of {len(cells)} cells not as expected: "
            + escape("; ".join(failures))
        )
        raise typer.Exit(1)


def _prove_nemesis(
    pipeline: Path,
    spec: PipelineSpec,
    state: Path,
    workdir: Path,
    steps: int | None,
    sequence: str | None,
    seed: int,
    shrink_minutes: float,
    resume: bool,
) -> None:
    from streamproof.harness.daemons import Daemons
    from streamproof.harness.resume import PauseOnSignal, resumed
    from streamproof.harness.search import replay, search
    from streamproof.jvm.session import local_session

    spark = local_session(spec.spark, app_name=f"streamproof-nemesis:{spec.name}")  # the checkers' session
    daemons = Daemons.started_under(state, spec)
    restartable = daemons.restartable()
    console.print(
        f"nemesis on {pipeline} (servers it may restart: {', '.join(restartable) or 'none'}); "
        f"its pipelines under {workdir}",
        markup=False,
    )
    with PauseOnSignal() as pause:
        nemesis, to_replay, start = None, parse_sequence(sequence) if sequence is not None else None, 0
        if resume:
            nemesis, to_replay, start = resumed(pipeline, workdir, spark, daemons, emit_plain)
            emit_plain(f"resumed before step {start + 1} of {len(to_replay.steps)}")
        if to_replay is not None:
            outcome = replay(
                pipeline,
                to_replay,
                spark=spark,
                workdir=workdir,
                daemons=daemons,
                emit=emit_plain,
                nemesis=nemesis,
                start=start,
                pause_requested=pause.requested,
            )
        else:
            assert steps is not None
            outcome = search(
                pipeline,
                steps=steps,
                seed=seed,
                spark=spark,
                workdir=workdir,
                daemons=daemons,
                emit=emit_plain,
                shrink_minutes=shrink_minutes,
                pause_requested=pause.requested,
            )
    if outcome.paused is not None:
        console.print(
            f"nemesis: PAUSED, nothing judged yet; carry on with: streamproof prove {pipeline} "
            f"--nemesis-resume {outcome.paused.parent} --state-dir {state}",
            markup=False,
        )
        raise typer.Exit(3)
    if outcome.ok and not outcome.sequence:
        console.print("nemesis: UNKNOWN: no sequence ran (nothing was checked)", markup=False)
        raise typer.Exit(3)
    if outcome.ok:
        console.print(
            f"nemesis: OK, every sink 0 lost / 0 duplicated / 0 unexpected by both checkers after {outcome.sequence}",
            markup=False,
        )
        return
    console.print(f"nemesis: FAILED: {outcome.failure}", markup=False)
    console.print(f"replay it: streamproof prove {pipeline} --nemesis-replay '{outcome.sequence}'", markup=False)
    raise typer.Exit(1)


@app.command()
@friendly_errors
def demo(
    count: Annotated[int, typer.Option(min=1000, help="Events to generate.")] = 1_000_000,
    kills: Annotated[int, typer.Option(min=0, help="Random SIGKILLs during the run.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the data and of the kill moments.")] = 7,
    state_dir: StateDir = None,
) -> None:
    """The whole story on embedded defaults: Kafka up, 1M events, exactly-once through SIGKILLs, proof."""
    from streamproof.demo import run_demo

    report = run_demo(console, state_path(state_dir), count=count, kills=kills, seed=seed)
    if not report.ok:
        raise typer.Exit(1)
