"""What a crash of the pipeline left on disk, and whether it shows the crash happened where it was armed.

A crash that left no trace proves nothing: a cell whose counts are clean because its kill came too early, too late
or never is a blind harness, not a guarantee. Right after each SIGKILL, before any restart, the harness reads the
checkpoint and every sink (:func:`crash_facts`); :func:`crash_happened` then checks them against what the point
means (DESIGN.md's crash points), and a mismatch is recorded as a missed fault, which fails the cell. The faults of
the machines have their own evidence, in Spark's event log (:func:`streamproof.harness.cluster.fault_happened`).

Example::

    >>> facts = {"offsets_logged": True, "checkpoint_committed": False, "sink_has_batch": True, "write_started": ["d"]}
    >>> crash_happened("after-sink-commit", facts, "d") is None
    True
    >>> evidence_text(facts)
    'offsets logged; write started: d; every sink holds the batch; not in the commit log'
"""

from __future__ import annotations

from typing import Any

from streamproof.checkpoint.log import batch_end_offsets
from streamproof.config import PipelineSpec
from streamproof.faults import points as faults
from streamproof.sinks import open_sinks


def crash_facts(spec: PipelineSpec, batch_id: int, write_started: list[str]) -> dict[str, Any]:
    """What a crash in ``batch_id`` left: offset log, Spark commit log, and whether every sink holds the batch
    (and holds it keyed on the batch: txn id, ledger row, commit marker); for a fan-out, also ``held_by``,
    the labels of the sinks that hold it; ``write_started``: the sinks whose write of it had begun (the run's
    own events, in its log); ``partial_in``: sinks committing per partition that hold only part of it;
    ``unlogged``: sinks whose own log holds no batch at all (unkeyed writes keep none).

    >>> crash_facts(load_pipeline("orders.toml"), 1, ["delta"])["sink_has_batch"]           # doctest: +SKIP
    False
    """
    checkpoint = spec.checkpoint_dir
    logged = (checkpoint / "offsets" / str(batch_id)).exists()
    facts: dict[str, Any] = {
        "offsets_logged": logged,
        "checkpoint_committed": (checkpoint / "commits" / str(batch_id)).exists(),
    }
    # A batch id can recur (at-most-once restarts its numbering), so match the batch's offsets too.
    end_offsets = batch_end_offsets(checkpoint, batch_id) if logged else None
    # partial: sinks committing per partition that hold only some of the batch; unlogged: sinks holding no batch
    # at all in their own log (an unkeyed write under the weaker guarantees keeps none): no evidence from them.
    held, partial, unlogged = {}, [], []
    for sink in open_sinks(spec):
        # Your own sink's records say which batches it was handed, not what it holds: no evidence from them.
        commits = [] if sink.records_hand_outs else sink.commits()
        matching = [
            commit for commit in commits if commit.batch_id == batch_id and commit.end_offsets in (None, end_offsets)
        ]
        held[sink.name] = (bool(matching), any(commit.keyed for commit in matching))
        if matching and not any(commit.complete for commit in matching):
            partial.append(sink.name)
        if not commits:
            unlogged.append(sink.name)
    facts["sink_has_batch"] = all(has for has, _ in held.values())
    facts["sink_txn"] = all(keyed for _, keyed in held.values())
    if len(held) > 1:
        facts["held_by"] = [name for name, (has, _) in held.items() if has]
    facts["write_started"] = write_started
    if partial:
        facts["partial_in"] = partial
    if unlogged:
        facts["unlogged"] = unlogged
    return facts


def crash_happened(point: str, facts: dict[str, Any], sink: str) -> str | None:
    """Why ``facts`` (:func:`crash_facts`) do not show a crash of the driver at ``point`` in ``sink``'s write (the
    armed sink, or the first), in one line; None when they do.

    >>> crash_happened("before-sink-write", {"offsets_logged": True, "checkpoint_committed": False,
    ...                                      "sink_has_batch": False, "write_started": ["d"]}, "d")
    'before-sink-write: the write of d had already started'
    """
    started = facts.get("write_started", [])
    held_by = facts.get("held_by", [sink] if facts.get("sink_has_batch") else [])
    if not facts.get("offsets_logged"):
        return f"{point}: the offset log does not hold the batch (the kill came before Spark planned it)"
    committed = facts.get("checkpoint_committed")
    # Every sink whose write began holds the batch, except those that keep no log of their batches.
    not_holding = [name for name in started if name not in held_by and name not in facts.get("unlogged", [])]
    if point == faults.AFTER_CHECKPOINT_COMMIT:
        if not committed:
            return f"{point}: Spark's commit log does not hold the batch"
        if not started or not_holding or facts.get("partial_in"):
            return f"{point}: not every sink holds the batch ({', '.join(not_holding) or 'no write began'})"
        return None
    if committed:
        return f"{point}: Spark's commit log already holds the batch (the kill came after the batch ended)"
    if point == faults.BEFORE_SINK_WRITE:
        if started or held_by:
            return f"{point}: the write of {', '.join(started or held_by)} had already started"
    elif point == faults.MID_SINK_WRITE:
        if sink not in started:
            return f"{point}: the write of {sink} had not started"
        if sink in held_by and sink not in facts.get("partial_in", []):
            return f"{point}: {sink} already holds the whole batch (the kill came after its write)"
    elif point == faults.AFTER_SINK_COMMIT and (not started or not_holding or facts.get("partial_in")):
        return (
            f"{point}: not every sink holds the batch (the kill came before {', '.join(not_holding) or 'a sink'} "
            "committed)"
        )
    return None


def evidence_text(facts: dict[str, Any]) -> str:
    """The facts of a crash, or of a fault of the machines (task attempts from Spark's event log), as a short line
    for the matrix table (the JSON has them all)."""
    if "attempts" in facts:
        ends = ", ".join(f"{count} {end}" for end, count in sorted(facts.get("ends", {}).items()))
        speculative = f", {facts['speculative']} speculative" if facts.get("speculative") else ""
        return f"{facts['attempts']} write task attempts ({ends}){speculative}"
    parts = ["offsets logged" if facts.get("offsets_logged") else "offsets NOT logged"]
    started = facts.get("write_started")
    if started is not None:
        parts.append(f"write started: {', '.join(started)}" if started else "no write started")
    if "held_by" in facts and not facts.get("sink_has_batch"):
        held = facts["held_by"]
        parts.append(f"held by {', '.join(held)}" if held else "no sink holds the batch")
    else:
        parts.append("every sink holds the batch" if facts.get("sink_has_batch") else "no sink holds the batch")
    parts.append("in the commit log" if facts.get("checkpoint_committed") else "not in the commit log")
    moment = facts.get("moment")
    if moment:  # your own sink: where in its write the crash landed (streamproof.your_code.steps)
        parts.append(f"killed {moment['what']} ({moment['where']})")
    return "; ".join(parts)
