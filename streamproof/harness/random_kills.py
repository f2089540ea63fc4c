"""Random kills (``prove --random-kills K``): the pipeline run to the end of its source through K seeded SIGKILLs, each
at a uniformly random moment of a batch being written: the harness draws ``after`` (1 to 3 committed batches of the
current run) and ``phase`` (uniform in [0, 1)), waits for the ``after``-th committed batch, then sleeps ``phase``
times that batch's duration and kills. The moments are printed, to replay a failure.

Example::

    >>> result = run_with_random_kills(Path("orders.toml"), kills=2, seed=1, log_dir=Path("logs"))  # doctest: +SKIP
"""

from __future__ import annotations

import random
from pathlib import Path

from streamproof.errors import PipelineError
from streamproof.faults import points as faults
from streamproof.harness.child import RUN_TIMEOUT_S
from streamproof.harness.crashes import Crash, Emit, Harness, HarnessResult


def run_with_random_kills(
    pipeline_file: Path,
    *,
    kills: int,
    seed: int,
    log_dir: Path,
    emit: Emit = print,
    max_after_batches: int = 3,
    timeout_s: float = RUN_TIMEOUT_S,
) -> HarnessResult:
    """Run the pipeline to the end of its source through ``kills`` seeded random SIGKILLs (module docstring)."""
    rng = random.Random(seed)
    harness = Harness(pipeline_file, log_dir, emit, timeout_s)
    try:
        for number in range(1, kills + 1):
            run = harness.start()
            after, phase = rng.randint(1, max_after_batches), rng.random()
            if not harness.wait_for_batches(run, after):
                raise PipelineError(
                    f"kill {number}/{kills} missed: run {run.number} drained before committing {after} batches; "
                    "use more data or a smaller source.max_offsets_per_trigger"
                )
            waited = run.committed[-1][1]
            delay = phase * max(waited.duration_s, 0.2)
            if not harness.sleep_forwarding(run, delay):
                raise PipelineError(
                    f"kill {number}/{kills} missed: run {run.number} drained {delay:.2f} s after batch "
                    f"{waited.batch_id}; use more data or a smaller source.max_offsets_per_trigger"
                )
            killed_at = harness.kill(run, f"kill {number}/{kills}")
            harness.forward_remaining(run)
            in_flight = run.committed[-1][1].batch_id + 1
            emit(
                f"kill {number}/{kills}: run {run.number}, {delay:.2f} s after batch {waited.batch_id} committed "
                f"(after {after}, phase {phase:.2f}): SIGKILL pgid {run.child.pid}, batch {in_flight} in flight"
            )
            harness.record_crash(
                run,
                Crash(
                    faults.RANDOM,
                    in_flight,
                    killed_at - run.child.started_at,
                    run.number,
                    detail=f"{delay:.2f} s after batch {waited.batch_id} committed",
                    killed_monotonic=killed_at,
                ),
            )
        harness.drain()
    finally:
        result = harness.finish()
    return result
