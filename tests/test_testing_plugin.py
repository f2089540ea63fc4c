"""The pytest plugin users put in their own suites (streamproof.testing), used here as a user would.

Fault: a seeded random SIGKILL of the pipeline's process tree (exactly-once, 12,000 events).
Expected: lost 0, duplicated 0, unexpected 0; and a broken guarantee fails with the exact counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from streamproof.faults import surviving_processes
from streamproof.reconcile import Report
from streamproof.testing import GuaranteeBroken, Prover, assert_guarantee_held


@pytest.mark.integration
@pytest.mark.crash
def test_a_random_kill_exactly_once_through_the_plugin(streamproof_prover: Prover) -> None:
    # One kill (the 25-minute CI budget: two took 82 s); random kills of the pipeline itself are tested in
    # test_crash_recovery.py, this test is about the plugin's API.
    report = streamproof_prover.prove(
        REPO / "examples" / "orders_to_delta.toml", events=12_000, random_kills=1, seed=5, batch_size=2_000
    )
    harness = streamproof_prover.proofs[-1].harness
    assert len(harness.crashes) == 1 and harness.runs == 2
    assert surviving_processes(harness.process_groups) == []
    assert report.source_records == 12_000
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0)


def test_user_records_go_through_as_given(streamproof_prover: Prover, tmp_path: Path) -> None:
    records = [{"event_id": f"e{i}", "order_id": f"o{i % 7}", "amount": i / 10} for i in range(3_000)]
    records += [b"\xff not json", "{broken"]
    report = streamproof_prover.prove(
        REPO / "examples" / "orders_to_delta.toml", records=records, crash_at=["mid-sink-write"], batch_size=600
    )
    assert (report.source_records, report.sink_records, report.quarantined) == (3_002, 3_000, 2)


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
