"""The proof of a job as people read it: what streamproof changed, then per query its guarantee, each cell, and why.

Example (the shape, from docs/jobs.md)::

    query orders_bronze: Spark's delta sink, writes s3://prod/delta/bronze/orders/
      guarantee: exactly-once
      left out of the comparison: ingested_at (current_timestamp())
      before-sink-write         clean   lost 0, duplicated 0, unexpected 0  (offsets/1 written, nothing handed ...)
"""

from __future__ import annotations

import json

from streamproof.jobs.proof import JobProof, QueryVerdict
from streamproof.jobs.verdict import reading_label

SAMPLE_LINES = 3  # sample rows shown per term on the terminal (the JSON report holds up to 20)


def proof_lines(proof: JobProof) -> list[str]:
    """The whole report, line by line."""
    same = "unchanged by the proof" if proof.digest_before == proof.digest_after else "CHANGED during the proof"
    lines = [f"{proof.job.name} (sha256 {proof.digest_before[:16]}..., {same})"]
    if proof.twin.overrides:
        lines.append("streamproof changed, in every run of it:")
        lines += [f"  - {line}" for line in proof.twin.overrides]
    if proof.twin.not_applied:
        lines.append(f"not applied (streamproof's session runs the job): {', '.join(proof.twin.not_applied)}")
    for verdict in proof.verdicts:
        lines += [""] + query_lines(verdict)
    cells = [cell for verdict in proof.verdicts for cell in verdict.cells]
    missed = [cell for cell in cells if cell.missed]
    summary = ", ".join(f"{v.query.label}: {v.guarantee}" for v in proof.verdicts)
    lines.append("")
    lines.append(
        f"verdict ({proof.checker} checker): {summary}; {len(cells)} cells, {len(missed)} missed, {proof.seconds:.0f} s"
    )
    return lines


def query_lines(verdict: QueryVerdict) -> list[str]:
    query = verdict.query
    kind = (
        f"your {query.sink} {query.function}"
        if query.sink in ("foreachBatch", "foreach")
        else f"Spark's {query.sink} sink"
    )
    heading = query.label if query.label.startswith("query ") else f"query {query.label}"
    lines = [f"{heading}: {kind}" + (f", writes {query.address}" if query.address else "")]
    lines.append(f"  guarantee: {verdict.guarantee}")
    for reading, guarantee in verdict.by_reading.items():
        lines.append(f"    read {reading_label(reading)}: {guarantee}")
    if verdict.left_out:
        named = ", ".join(f"{name} ({why})" for name, why in sorted(verdict.left_out.items()))
        lines.append(f"  left out of the comparison: {named}")
    for reason in verdict.unknown:
        lines.append(f"  unknown: {reason}")
    if verdict.recomputed is not None and verdict.recomputed.clean:
        lines.append(
            f"  the twin's {verdict.recomputed.twin_rows:,} rows agree with the job's plan recomputed as one batch "
            "over the same records"
        )
    if query.moments:
        lines.append(f"  its write's durable steps: {'; '.join(query.moments)}")
    for cell in verdict.cells:
        lost, duplicated, unexpected = cell.damage()
        where = cell.missed or cell.landed or ""
        lines.append(
            f"  {cell.point:<26} {cell.outcome:<10} lost {lost:,}, duplicated {duplicated:,}, unexpected {unexpected:,}"
            f"  ({where})"
        )
        for name, checks in cell.also.items():
            same = "the same terms" if cell.checkers_agree else "OTHER TERMS: the checkers disagree"
            terms = ", ".join("/".join(map(str, c.counts.terms())) for c in checks)
            lines.append(f"      {name} checker: {same} ({terms} lost/duplicated/unexpected)")
        for check in cell.checks:
            if check.counts.clean:
                continue
            counts = check.counts
            lines.append(
                f"      {check.address} [{reading_label(check.reading)}]: lost {counts.lost:,}, duplicated "
                f"{counts.duplicated:,}, unexpected {counts.unexpected:,} of {counts.twin_rows:,} rows"
            )
            for term, rows in counts.samples.items():
                for row in rows[:SAMPLE_LINES]:
                    lines.append(f"        {term}: {json.dumps(row, default=str)[:200]}")
    lines.append(f"  why: {verdict.why}")
    return lines
