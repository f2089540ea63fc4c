"""``streamproof verify JOB.py``: what a ``streamproof run JOB.py`` wrote, compared with a crash-free twin of the job.

The run left its record (``<state>/jobs/<job>/record.json``: its outputs, the topics it read and their end offsets).
Verification runs the job once more, uncrashed, in a sandbox of its own below the same maps, and compares every
output of the run with the twin's, reading by reading (:mod:`streamproof.jobs.compare`). The twin must read what the
run read: a topic that grew since the run is refused (the twin would read records the run never saw). With
``independent``, the same outputs are read a second time without Spark (delta-rs, pyarrow, confluent-kafka, psycopg)
and both checkers' terms are shown side by side; they must agree term by term.

Example::

    $ streamproof run examples/jobs/orders_bronze.py --kafka 127.0.0.1:9092 --map s3://prod/=.streamproof/prod/
    $ streamproof verify examples/jobs/orders_bronze.py --kafka 127.0.0.1:9092 --map s3://prod/=.streamproof/prod/
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamproof.errors import ConfigError
from streamproof.jobs.maps import AddressMaps
from streamproof.jobs.outputs import IndependentReader, SparkReader
from streamproof.jobs.proof import JobProver, compare_outputs
from streamproof.jobs.record import JobRecord
from streamproof.jobs.verdict import OutputCheck
from streamproof.kafka_client import topic_end_offsets


@dataclass
class JobVerification:
    """The comparison of a run's outputs with the twin's, by one checker or two."""

    run: JobRecord
    twin: JobRecord
    checks: dict[str, list[OutputCheck]] = field(default_factory=dict)  # checker -> its checks

    @property
    def agree(self) -> bool:
        """Whether every checker counted the same terms for every output and reading."""
        terms = [sorted((c.address, c.reading, c.counts.terms()) for c in checks) for checks in self.checks.values()]
        return all(found == terms[0] for found in terms)

    @property
    def ok(self) -> bool:
        return self.agree and all(check.counts.clean for checks in self.checks.values() for check in checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.run.job,
            "checkers": {name: [check.to_dict() for check in checks] for name, checks in self.checks.items()},
            "agree": self.agree,
            "ok": self.ok,
        }


def refuse_if_the_topics_moved(run: JobRecord, maps: AddressMaps) -> None:
    """The twin reads what the topics hold now: refused when that is not what the run read."""
    servers = maps.kafka or "127.0.0.1:9092"
    for topic, ends in run.topics.items():
        now = {str(partition): high for partition, high in topic_end_offsets(servers, topic).items()}
        if now != ends:
            grown = sum(now.get(p, 0) - ends.get(p, 0) for p in now)
            raise ConfigError(
                f"topic {topic} changed since the run ({grown:+,} records): the twin would read other records than the "
                "run; run the job again (streamproof run JOB.py ...), then verify"
            )


def verify_job(
    job: Path,
    argv: list[str],
    maps: AddressMaps,
    *,
    record_folder: Path,
    workdir: Path,
    emit: Any = print,
    spark: Any = None,
    independent: bool = False,
) -> JobVerification:
    """Compare the run recorded in ``record_folder`` with a fresh twin (see the module)."""
    run = JobRecord.read(record_folder)
    if run is None:
        raise ConfigError(f"no run of {job} to verify in {record_folder}: run it first (streamproof run {job} ...)")
    if run.maps != maps.describe():
        raise ConfigError(
            f"verify's maps differ from the run's ({'; '.join(run.maps) or 'none'}): give the flags the run had"
        )
    refuse_if_the_topics_moved(run, maps)
    prover = JobProver(job, argv, maps, workdir=workdir / time.strftime("%Y%m%dT%H%M%S"), emit=emit)
    twin = prover.twin()
    found = JobVerification(run, twin)
    if spark is not None:
        found.checks["Spark"] = compare_outputs(twin, run, SparkReader(spark, maps), maps)
    if independent:
        found.checks["independent"] = compare_outputs(twin, run, IndependentReader(maps), maps)
    return found


def verification_lines(found: JobVerification) -> list[str]:
    """Each output and reading, each checker's terms side by side."""
    names = list(found.checks)
    lines = [f"{Path(found.run.job).name}: the run's outputs against a crash-free twin ({' and '.join(names)} checker)"]
    first = found.checks[names[0]] if names else []
    for index, check in enumerate(first):
        terms = "  |  ".join(
            f"{name}: lost {c.counts.lost:,}, duplicated {c.counts.duplicated:,}, unexpected {c.counts.unexpected:,}"
            for name in names
            for c in found.checks[name][index : index + 1]
        )
        counts = check.counts
        lines.append(f"  {check.address} [{check.reading}] ({counts.rows:,} rows, twin {counts.twin_rows:,}): {terms}")
        if check.counts.left_out:
            lines.append(f"    left out: {', '.join(f'{k} ({v})' for k, v in sorted(check.counts.left_out.items()))}")
    verdict = "ok" if found.ok else ("the checkers disagree" if not found.agree else "damaged")
    lines.append(f"verify: {verdict}")
    return lines
