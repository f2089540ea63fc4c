"""A proof of one pipeline: crash it (named points or seeded random kills), drain it, reconcile every sink.

What ``streamproof prove --crash-at / --random-kills``, :func:`streamproof.harness` and the pytest plugin run.

Example::

    >>> proof = prove_pipeline(Path("orders.toml"), crash_at=["after-sink-commit"], log_dir=Path("l"))  # doctest: +SKIP
    >>> proof.ok, proof.crashes[0].point                                                              # doctest: +SKIP
    (True, 'after-sink-commit')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from streamproof.config import load_pipeline
from streamproof.errors import ConfigError
from streamproof.harness.cluster import ClusterFaults
from streamproof.harness.crashes import Crash, Emit, HarnessResult, run_with_crashes
from streamproof.harness.random_kills import run_with_random_kills
from streamproof.jvm.session import local_session
from streamproof.reconcile import Report, verify_pipeline


@dataclass
class Proof:
    """The crashes a proof caused and the reconciliation of every sink afterwards (each report lists them)."""

    reports: list[Report]
    harness: HarnessResult

    @property
    def crashes(self) -> list[Crash]:
        return self.harness.crashes

    @property
    def missed(self) -> list[str]:
        """Faults of the machines that left no evidence of happening (each fails the proof)."""
        return self.harness.missed

    @property
    def unread(self) -> list[str]:
        """The sinks whose records the drained pipeline did not all read (not yet read after the drain: it stopped
        early), each with the count: a proof over records never read proves nothing about them."""
        return [
            f"{report.sink}: {report.not_yet_read:,} records not read" for report in self.reports if report.not_yet_read
        ]

    @property
    def ok(self) -> bool:
        """Every fault happened, the pipeline read every record, and nothing was lost, duplicated or unexpected in any
        sink."""
        return not self.missed and not self.unread and all(report.ok for report in self.reports)

    @property
    def guarantee_held(self) -> bool:
        """Every fault happened, and the damage found in every sink is within what the guarantee allows."""
        return not self.missed and not self.unread and all(report.guarantee_held for report in self.reports)


def prove_pipeline(
    pipeline_file: Path,
    *,
    crash_at: Sequence[str] = (),
    random_kills: int = 0,
    seed: int = 1,
    log_dir: Path,
    emit: Emit = print,
    spark: SparkSession | None = None,
    manifest_dir: Path | None = None,
    cluster: ClusterFaults | None = None,
) -> Proof:
    """Crash the pipeline at each of ``crash_at`` (or ``random_kills`` times at seeded random moments), drain it,
    and reconcile (with ``spark``, or a session built from the pipeline's ``[spark]`` settings)."""
    if crash_at and random_kills:
        raise ConfigError("choose crash points or random kills, not both")
    spec = load_pipeline(pipeline_file)
    if spec.on_distributed_storage and spark is None:  # what a crash left is read through Spark's JVM
        spark = local_session(spec.spark, app_name=f"streamproof-verify:{spec.name}")
    if crash_at:
        harness = run_with_crashes(pipeline_file, crash_at, log_dir=log_dir, emit=emit, cluster=cluster)
    else:
        harness = run_with_random_kills(pipeline_file, kills=random_kills, seed=seed, log_dir=log_dir, emit=emit)
    spark = spark or local_session(spec.spark, app_name=f"streamproof-verify:{spec.name}")
    reports = verify_pipeline(spark, spec, manifest_dir=manifest_dir)
    for report in reports:
        report.crashes = [crash.to_dict() for crash in harness.crashes]
    return Proof(reports, harness)
