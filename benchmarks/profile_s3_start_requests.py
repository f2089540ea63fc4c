"""The S3 requests of a run's start, step by step, and of a whole restart, on the SeaweedFS of ``streamproof infra up
--s3``, counted by the store itself (``SeaweedFS_s3_request_total`` by kind; a HEAD counts as a GET, as S3 bills it).

Usage::

    streamproof infra up --s3                      # --state-dir S when it is not .streamproof
    python benchmarks/profile_s3_start_requests.py [S]

An exactly-once pipeline from a files source (4 local files of 2,000 JSON records, one a batch) to a Delta table,
with its checkpoint and quarantine table, under a fresh prefix of the bucket. It runs once (4 batches, a child
process); then this process takes each step of a start as ``pipeline/query.py`` does (lock, checks, batch path), the
requests of each counted; then a restart with nothing new (a child process: its JVM start too). Findings:
docs/performance.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamproof import sources
from streamproof.checkpoint.folder import RunCounter, RunLock
from streamproof.checkpoint.log import check_readable
from streamproof.checkpoint.positions import held_beyond, refuse_if_sink_behind, refuse_if_source_behind
from streamproof.checkpoint.recover import refuse_if_checkpoint_lost
from streamproof.checkpoint.start import read_sinks, starting_point
from streamproof.config import load_pipeline
from streamproof.infra.s3 import S3_BUCKET, S3Server
from streamproof.jvm.session import build_session
from streamproof.pipeline.batches import open_batch_path
from streamproof.sinks import open_sinks

KINDS = ("LIST", "GET", "PUT", "DELETE")
SCHEMA = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"


def main() -> None:
    server = S3Server(Path(sys.argv[1] if len(sys.argv) > 1 else ".streamproof"))
    work = Path(tempfile.mkdtemp(prefix="s3-start-"))
    pipeline = _write_pipeline(work, server, f"s3a://{S3_BUCKET}/start-requests-{time.time_ns()}")
    child = {**os.environ, "STREAMPROOF_SPARK_UI": "off"}
    run = [sys.executable, "-m", "streamproof", "run", str(pipeline), "--available-now"]
    first = _counted(server, lambda: subprocess.run(run, env=child, capture_output=True, check=True))[0]
    spec = load_pipeline(pipeline)
    spark = build_session(spec.spark, app_name="start-requests", ui=False)
    steps: list[tuple[str, dict[str, int]]] = []

    def step(name: str, do: Callable[[], Any]) -> Any:
        counts, answer = _counted(server, do)
        steps.append((name, counts))
        return answer

    try:
        lock = RunLock(spec.checkpoint_dir)
        step("run lock taken", lock.__enter__)
        start = step("starting_point", lambda: starting_point(spec))
        step("check_readable", lambda: check_readable(spec.checkpoint_dir, "recover", start.logs))
        step("refuse_if_source_behind", lambda: refuse_if_source_behind(spec, start, sources.require_available(spec)))
        sinks = open_sinks(spec)
        held = step("read_sinks", lambda: read_sinks(spark, sinks, start))
        step("refuse_if_checkpoint_lost", lambda: refuse_if_checkpoint_lost(spec, held))
        step("refuse_if_sink_behind", lambda: refuse_if_sink_behind(spec, held))
        writer = step("open_batch_path", lambda: open_batch_path(spark, spec, sinks, exactly_once=True))
        step("RunCounter.count_start", lambda: RunCounter(spec.checkpoint_dir).count_start())
        step("held_beyond", lambda: held_beyond(spec, writer.sinks, start))
        step("run lock released", lambda: lock.__exit__())
    finally:
        spark.stop()
    restart = _counted(server, lambda: subprocess.run(run, env=child, capture_output=True, check=True))[0]
    total = {kind: sum(counts[kind] for _, counts in steps) for kind in KINDS}
    print(f"{'':34}" + "".join(f"{kind:>8}" for kind in KINDS))
    for name, counts in [
        *steps,
        ("the start's steps, in all", total),
        ("first run (4 batches)", first),
        ("restart, nothing new (a process)", restart),
    ]:
        print(f"{name:34}" + "".join(f"{counts[kind]:8}" for kind in KINDS))


def _counted(server: S3Server, do: Callable[[], Any]) -> tuple[dict[str, int], Any]:
    before = server.requests_served()
    answer = do()
    after = server.requests_served()
    return {kind: after[kind] - before[kind] for kind in KINDS}, answer


def _write_pipeline(work: Path, server: S3Server, root: str) -> Path:
    source = work / "in"
    source.mkdir()
    for part in range(4):
        lines = (
            json.dumps(
                {
                    "event_id": f"e{number}",
                    "order_id": f"o{number % 1500}",
                    "customer_id": f"c{number % 97}",
                    "amount": 10.5,
                    "status": "paid",
                    "event_time": "2026-11-27T10:00:00",
                }
            )
            for number in range(part * 2000, (part + 1) * 2000)
        )
        (source / f"part-{part}.json").write_text("\n".join(lines) + "\n")
    conf = "\n".join(f'"{key}" = "{value}"' for key, value in server.spark_conf().items())
    pipeline = work / "pipeline.toml"
    pipeline.write_text(
        f'name = "start-requests"\nguarantee = "exactly-once"\ncheckpoint = "{root}/checkpoint"\n\n'
        f'[source]\nkind = "files"\npath = "{source}"\nmax_files_per_trigger = 1\n\n'
        f'[transform]\nformat = "json"\nschema = "{SCHEMA}"\nrequired = ["event_id", "order_id"]\n'
        f'quarantine = "{root}/quarantine"\n\n[sink]\nkind = "delta"\npath = "{root}/orders"\nmode = "append"\n\n'
        f"[spark.conf]\n{conf}\n"
    )
    return pipeline


if __name__ == "__main__":
    main()
