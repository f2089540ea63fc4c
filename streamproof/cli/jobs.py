"""``streamproof run|prove|verify JOB.py``: a job file as a team ships it (a ``.py`` argument selects this mode).

Arguments parsing only: the maps from the flags, the job's text checked before anything runs, then one call into
:mod:`streamproof.jobs`.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Annotated

import typer

from streamproof.cli.base import console, emit_plain, state_path, write_output
from streamproof.errors import ConfigError
from streamproof.jobs.maps import AddressMaps
from streamproof.jobs.recompute import RECOMPUTED
from streamproof.pipeline.events import Event, side_channel

Kafka = Annotated[
    str | None,
    typer.Option("--kafka", help="JOB.py: every kafka.bootstrap.servers of the job goes to this HOST:PORT."),
]
Maps = Annotated[
    list[str] | None,
    typer.Option(
        "--map",
        help="JOB.py, repeatable: FROM=TO, every path or URI of the job under FROM is read and written under TO "
        "(s3://prod/=/tmp/proof/, s3://prod/=s3a://streamproof/prod/, postgresql://db/orders=postgresql://"
        "127.0.0.1/streamproof).",
    ),
]
Inputs = Annotated[
    list[str] | None,
    typer.Option("--input", help="JOB.py, repeatable: FROM=TO for data the job only reads (shared, never written)."),
]
Topics = Annotated[
    list[str] | None, typer.Option("--topic", help="JOB.py, repeatable: FROM=TO, the job's topic FROM is TO here.")
]
JobState = Annotated[Path | None, typer.Option("--job-state", hidden=True, help="Where a job run keeps its record.")]
Sandbox = Annotated[str | None, typer.Option("--sandbox", hidden=True, help="A proof's sandbox this run is in.")]
LocalRoot = Annotated[
    Path | None, typer.Option("--local-root", hidden=True, help="Where the sandbox's local paths go.")
]
ThenRecompute = Annotated[
    bool,
    typer.Option("--then-recompute", hidden=True, help="A proof's twin: then its plan again as one batch, in-process."),
]
JobArgs = Annotated[list[str] | None, typer.Argument(help="JOB.py: after --, the job's own arguments (its sys.argv).")]


def is_job(path: Path) -> bool:
    """Whether a command's file argument is a job file (``.py``) rather than a pipeline file.

    >>> is_job(Path("orders_bronze.py")), is_job(Path("orders.toml"))
    (True, False)
    """
    return path.suffix == ".py"


def job_maps(
    kafka: str | None, maps: list[str] | None, inputs: list[str] | None, topics: list[str] | None
) -> AddressMaps:
    return AddressMaps.from_flags(kafka, maps, inputs, topics)


def refuse_before_running(job: Path, maps: AddressMaps) -> None:
    """Every production address the job's text names that no map covers, refused before anything runs (exit 2)."""
    from streamproof.jobs.scan import scan_job

    if not job.is_file():
        raise ConfigError(f"{job}: no such job file")
    found = scan_job(job, maps)
    if found:
        for refusal in found[1:]:
            console.print(f"refused: {refusal.line()}", markup=False)
        more = f" (and {len(found) - 1} more above)" if len(found) > 1 else ""
        raise ConfigError(found[0].line() + more)


def run_job_command(
    job: Path,
    argv: list[str],
    maps: AddressMaps,
    state_dir: Path | None,
    job_state: Path | None,
    master: str | None,
    sandbox: str | None = None,
    local_root: Path | None = None,
    then_recompute: bool = False,
) -> None:
    """``streamproof run JOB.py``: the job once, under the maps, its changes printed as they are made (a proof's
    twin, ``then_recompute``: then the job again in this process, its plan as one batch over the same records,
    streamproof.jobs.recompute)."""
    from streamproof.jobs.child import JobRun

    refuse_before_running(job, maps)
    if sandbox is not None:
        maps = maps.within(sandbox, str(local_root) if local_root else None)
    for line in maps.describe():
        emit_plain(f"[{job.stem}] maps {line}")
    channel = side_channel()

    def publish(event: Event) -> None:
        if channel is not None:
            channel(event)
        if event.shown:
            emit_plain(event.line())

    folder = job_state or state_path(state_dir) / "jobs" / job.stem
    record = JobRun(job, argv, maps, folder, master=master, publish=publish).run()
    if then_recompute and record.topics:  # the same JVM, warm: a second oracle for the proof at a run's cost of none
        again = maps.within(f"{maps.sandbox}-recompute", str(local_root) + "-recompute") if maps.sandbox else maps
        JobRun(job, argv, again, folder / RECOMPUTED, master=master, recompute=record.topics).run()
    queries = ", ".join(f"{query.label} ({query.sink})" for query in record.queries)
    emit_plain(f"[{job.stem}] done: {len(record.queries)} queries ({queries}); record {folder / 'record.json'}")


def no_job_arguments(path: Path, args: list[str] | None, kafka: str | None, maps: list[str] | None) -> None:
    """A pipeline file takes none of a job's flags: said in one line."""
    if args or kafka or maps:
        raise typer.BadParameter(f"{path} is a pipeline file: --kafka, --map and job arguments are for JOB.py")


def prove_job_command(
    job: Path,
    argv: list[str],
    maps: AddressMaps,
    state_dir: Path | None,
    points: list[str] | None,
    master: str | None,
    json_file: Path | None,
    independent: bool,
) -> bool:
    """``streamproof prove JOB.py``: the twin, the cells, a verdict per query; True when every one is exactly-once."""
    from streamproof.jobs.proof import prove_job
    from streamproof.jobs.report import proof_lines
    from streamproof.jvm.session import local_session

    refuse_before_running(job, maps)
    for line in maps.describe():
        emit_plain(f"maps {line}")
    workdir = state_path(state_dir) / "jobs" / job.stem / time.strftime("%Y%m%dT%H%M%S")
    spark = functools.partial(local_session, app_name=f"streamproof-prove:{job.stem}")  # started once needed
    proof = prove_job(
        job,
        argv,
        maps,
        workdir=workdir,
        points=points,
        emit=emit_plain,
        master=master,
        independent=independent,
        spark=spark,
    )
    for line in proof_lines(proof):
        console.print(line, markup=False)
    console.print(f"cells and their logs under {workdir}", markup=False)
    write_output(json_file, json.dumps(proof.to_dict(), indent=2, default=str))
    return proof.ok


def verify_job_command(
    job: Path, argv: list[str], maps: AddressMaps, state_dir: Path | None, json_file: Path | None, independent: bool
) -> bool:
    """``streamproof verify JOB.py``: the last run's outputs against a fresh twin; True when clean (and agreed)."""
    from streamproof.jobs.verify import verification_lines, verify_job
    from streamproof.jvm.session import local_session

    refuse_before_running(job, maps)
    folder = state_path(state_dir) / "jobs" / job.stem
    spark = functools.partial(local_session, app_name=f"streamproof-verify:{job.stem}")  # started once needed
    found = verify_job(
        job,
        argv,
        maps,
        record_folder=folder,
        workdir=folder / "verify",
        emit=emit_plain,
        spark=spark,
        independent=independent,
    )
    for line in verification_lines(found):
        console.print(line, markup=False)
    write_output(json_file, json.dumps(found.to_dict(), indent=2, default=str))
    return found.ok
