"""The pytest plugin users put in their own suites (streamproof.testing), used here as a user would.

Fault: a seeded random SIGKILL of the pipeline's process tree (exactly-once, 3,002 records of the test's own).
Expected: lost 0, duplicated 0, unexpected 0; and a broken guarantee fails with the exact counts.
"""

from __future__ import annotations

import pytest

from conftest import REPO
from streamproof.faults.points import surviving_processes
from streamproof.reconcile import Report
from streamproof.testing import GuaranteeBroken, Prover, assert_guarantee_held


@pytest.mark.integration
@pytest.mark.crash
def test_user_records_go_through_a_random_kill_as_given(streamproof_prover: Prover) -> None:
    """The plugin's two inputs in one proof (the 25-minute CI budget): the user's own records, malformed ones
    included, and a seeded random SIGKILL of the pipeline's process tree. Random kills of the pipeline itself
    are tested on 100,000 events in test_crash_recovery.py; `crash_at` points everywhere else."""
    records = [{"event_id": f"e{i}", "order_id": f"o{i % 7}", "amount": i / 10} for i in range(3_000)]
    records += [b"\xff not json", "{broken"]
    # Seed 5 kills 0.26 of a batch after the third committed batch: five batches of 600 leave it room.
    report = streamproof_prover.prove(
        REPO / "examples" / "orders_to_delta.toml", records=records, random_kills=1, seed=5, batch_size=600
    )
    harness = streamproof_prover.proofs[-1].harness
    assert len(harness.crashes) == 1 and harness.runs == 2
    assert surviving_processes(harness.process_groups) == []
    assert (report.source_records, report.sink_records, report.quarantined) == (3_002, 3_000, 2)
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0)


@pytest.mark.parametrize(
    ("guarantee", "lost", "duplicated", "unexpected", "broken"),
    [
        ("exactly-once", 0, 0, 0, False),
        ("exactly-once", 1, 0, 0, True),
        ("exactly-once", 0, 2, 0, True),
        ("at-least-once", 0, 5, 0, False),
        ("at-least-once", 3, 0, 0, True),
        ("at-most-once", 4, 0, 0, False),
        ("at-most-once", 0, 1, 0, True),
        ("at-most-once", 0, 0, 1, True),
    ],
)
def test_guarantee_check_fails_with_exact_counts(
    guarantee: str, lost: int, duplicated: int, unexpected: int, broken: bool
) -> None:
    report = Report(pipeline="orders", guarantee=guarantee, sink="delta", source_records=100, expected=100,
                    quarantined=0, upstream_duplicates=0, sink_records=100 - lost + duplicated, lost=lost,
                    duplicated=duplicated, unexpected=unexpected,
                    crashes=[{"point": "after-sink-commit", "batch_id": 1}])  # fmt: skip
    if not broken:
        assert_guarantee_held(report)
        return
    with pytest.raises(GuaranteeBroken) as raised:
        assert_guarantee_held(report)
    assert str(raised.value) == (
        f"{guarantee} broken for orders: lost {lost}, duplicated {duplicated}, unexpected {unexpected} "
        "of 100 expected records; crashes [('after-sink-commit', 1)]"
    )
