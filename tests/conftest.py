"""Shared fixtures. Integration tests start the real Kafka broker through the project's own infra code
(on free ports, under a temporary state folder) and a real local Spark session, and always stop them."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamproof.demo import write_demo_pipeline
from streamproof.faults.points import process_cmdline, process_table
from streamproof.harness.child import jvm_temporary_files_in
from streamproof.infra import KafkaBroker
from streamproof.storage.location import Location

REPO = Path(__file__).resolve().parent.parent
# Every JVM a test starts lives seconds: C1 only (see streamproof.jvm.session.jit_option), inherited by the
# pipeline runs the tests start as child processes.
os.environ.setdefault("STREAMPROOF_JIT", "quick-start")
os.environ.setdefault("STREAMPROOF_SPARK_UI", "off")  # the tests that want Spark's UI turn it on for their run
CLI_TIMEOUT_S = 600

# Every driver JVM the suite starts keeps its temporary files (Spark's session folders, the native libraries it unpacks)
# in one folder of the run, removed at its end (pytest_unconfigure): only a JVM's exit hooks delete them, which a JVM
# the tests SIGKILL never runs, and a run left about 150 MB of them in /tmp. The harness's runs keep theirs in their own
# scratch folder (streamproof.harness.child.jvm_temporary_files_in: the later option wins). Set in the main process
# before pytest-xdist starts its workers, which inherit it, as does every process they start.
SUITE_TEMPORARY_FILES_ENV = "STREAMPROOF_SUITE_TMP"
SUITE_TEMPORARY_FILES: Path | None = None
if SUITE_TEMPORARY_FILES_ENV not in os.environ:
    SUITE_TEMPORARY_FILES = Path(tempfile.mkdtemp(prefix="streamproof-suite-"))
    os.environ[SUITE_TEMPORARY_FILES_ENV] = str(SUITE_TEMPORARY_FILES)
    submit_options = os.environ.get("SPARK_SUBMIT_OPTS", "")
    os.environ["SPARK_SUBMIT_OPTS"] = jvm_temporary_files_in(SUITE_TEMPORARY_FILES, submit_options)

# The slow tier: each of these proves again what a faster test in CI proves (named beside it). `make test` (CI, and
# its 25-minute budget) leaves them out; `make test-all` (pytest --slow) runs them too.
# tests/data holds files the tests read, never run as tests: its job files start a SparkSession when imported, which
# --doctest-modules would do in a worker (and leave that worker a session without the jars).
collect_ignore = ["data"]

SLOW_TIER = {
    "tests/test_s3.py::test_a_pipeline_on_s3_sigkilled_on_host_a_is_taken_over_from_host_b_by_itself":
        "tests/test_lease.py::test_a_pipeline_sigkilled_on_host_a_is_restarted_on_host_b_by_itself_and_reconciles_"
        "exactly (the same takeover on a local checkpoint) and tests/test_s3.py::test_a_lease_renewal_on_s3_that_a_"
        "takeover_overtook_is_refused_by_the_store (the lease on S3: renewed conditionally, a takeover there refused)",
    "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
    "inside-the-delta-write]":
        "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
        "inside-the-postgres-write] (a run paused inside its sink's write, taken over, woken: one line, the new "
        "holder's lock kept, 0/0/0; it fails without the lease checks after a failed write too)",
    **{
        "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
        f"between-batches-{kind}]": "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_"
        f"it_wakes_damages_nothing[inside-the-{kind}-write] (the same sink paused later in the batch) and the "
        "between-batches cell of the Delta sink (a pause after a commit: Spark's own offset log refuses the woken run)"
        for kind in ("postgres", "kafka", "files")
    },
    "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
    "inside-your-own-write]":
        "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
        "inside-the-postgres-write] (a sink's write paused, taken over, woken: one line, 0/0/0) and tests/test_your_"
        "code.py::test_a_run_that_lost_its_lease_marks_a_hand_out_returned_only_as_the_new_holder_holds_it (your "
        "sink's record of the batch, written by a woken run, is the new holder's)",
    "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
    "inside-the-kafka-write]":
        "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
        "inside-the-postgres-write] (a write from Python tasks paused with its transactions open, taken over, woken: "
        "one line, 0/0/0) and tests/test_sinks_exactly_once.py's kills of the Kafka sink mid-write (a zombie "
        "producer's transaction fenced by the next run's)",
    "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
    "inside-the-files-write]":
        "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
        "inside-the-postgres-write] (a sink's write paused, taken over, woken: one line, 0/0/0) and tests/test_sink_"
        "idempotency.py::test_first_write_then_replay_is_a_no_op[files] (a replayed batch of the folder written once)",
    "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
    "between-batches]":
        "tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing["
        "inside-the-postgres-write] (the same takeover and waking, the pause later in the batch) and tests/test_"
        "lease.py::test_a_holder_paused_past_its_lease_is_taken_over_and_stops_in_one_line_when_it_wakes (a holder "
        "paused between its checks: one line, the new holder's lock kept)",
    "tests/test_foreach_batch.py::test_the_textbook_ledger_runs_unchanged_its_duplicate_is_found_and_its_lost_"
    "checkpoint_refused":
        "tests/test_foreach_batch.py::test_the_textbook_ledger_s_lost_checkpoint_is_refused_before_it_writes_then_"
        "recovered (the lost checkpoint refused twice, recovered, drained 0/0/0), tests/test_your_code.py::test_your_"
        "sinks_get_the_guarantee_their_code_gives (a ledger checked before the rows, SIGKILLed between its two commits "
        "at a moment found without a marker: duplicated) and tests/test_cluster.py::test_the_ledger_job_on_the_"
        "cluster_gives_the_verdict_it_gives_locally (this textbook Delta ledger, duplicated between its two commits)",
    "tests/test_jobs.py::test_the_ledger_job_duplicates_when_killed_between_its_two_commits_and_is_clean_after_the_"
    "second":
        "tests/test_cluster.py::test_the_ledger_job_on_the_cluster_gives_the_verdict_it_gives_locally (the same job, "
        "its own argument, its two durable steps found without a marker and crashed after each: duplicated after the "
        "first, clean after the second; on the cluster, through an executor's loss too)",
    "tests/test_jobs.py::test_the_wheel_set_up_outside_the_checkout_proves_the_tutorial_delta_job_exactly_once_at_"
    "each_moment[every-moment]":
        "tests/test_jobs.py::test_the_wheel_set_up_outside_the_checkout_proves_the_tutorial_delta_job_exactly_once_at_"
        "each_moment[sink-moments] (the same wheel, set-up and job, crashed mid-write and after the sink's commit: the "
        "moments where the sink and Spark's log disagree) and tests/test_sinks_exactly_once.py::test_every_sink_is_"
        "exactly_once_through_every_crash_point (Spark's own Delta sink before its write and after the checkpoint's "
        "commit, among the others)",
    "tests/test_cluster.py::test_the_ledger_job_on_the_cluster_gives_the_verdict_it_gives_locally[both-commits]":
        "tests/test_cluster.py::test_the_ledger_job_on_the_cluster_gives_the_verdict_it_gives_locally[first-commit] "
        "(the executor's loss and the kill after the first durable step, which decides the verdict) and tests/test_"
        "your_code.py::test_your_sinks_get_the_guarantee_their_code_gives (a ledger checked before its rows, "
        "SIGKILLed at its second commit found without a marker)",
    "tests/test_s3.py::test_a_quarantine_table_on_s3_behind_a_local_checkpoint_is_refused_at_start_then_rewound":
        "tests/test_s3.py::test_checkpoint_commands_and_maintenance_work_on_s3 (a table on S3 that lost its newest "
        "commit refused at start in one line, `checkpoint rewind`, both checkers 0/0/0)",
    "tests/test_kafka_cluster.py::test_a_transaction_through_a_broker_fault_commits_once_and_its_replay_writes_"
    "nothing[controller]":
        "tests/test_kafka_cluster.py::test_a_transaction_through_a_broker_fault_commits_once_and_its_replay_writes_"
        "nothing[leader] (a node of the quorum SIGKILLed mid-transaction, its partitions led elsewhere)",
    "tests/test_kafka_cluster.py::test_a_transaction_through_a_broker_fault_commits_once_and_its_replay_writes_"
    "nothing[pause]":
        "tests/test_kafka_cluster.py::test_a_transaction_through_a_broker_fault_commits_once_and_its_replay_writes_"
        "nothing[leader] (the partition's leader gone mid-transaction, led elsewhere; the replay's check as it goes)",
    "tests/test_other_writers.py::test_a_table_restored_by_another_writer_is_refused_at_start_then_rewound_and_"
    "nothing_is_lost":
        "tests/test_other_writers.py::test_batches_a_restore_undid_are_merged_again_and_a_restore_under_a_running_sink_"
        "stops_it (the RESTORE read in effect, its words, the replay under an appId of its own) and tests/test_"
        "checkpoint_recovery.py::test_lost_and_damaged_checkpoints_are_refused_then_rebuilt_from_the_sinks (a Delta "
        "sink behind the checkpoint refused at start in one line, `checkpoint rewind`, both checkers 0/0)",
    "tests/test_other_writers.py::test_the_nemesis_s_restores_of_the_table_by_another_writer_are_refused_rewound_and_"
    "end_clean":
        "tests/test_other_writers.py::test_batches_a_restore_undid_are_merged_again_and_a_restore_under_a_running_sink_"
        "stops_it (a RESTORE by another writer: its batches replayed, a running sink stopped)",
    "tests/test_other_writers.py::test_rows_another_process_appends_and_deletes_are_counted_named_and_the_pipeline_"
    "runs_on":
        "tests/test_pipeline_end_to_end.py::test_negative_control_one_duplicate_and_one_loss_are_reported (a row "
        "appended and a row deleted by another writer, counted exactly) and streamproof/sinks/delta_log.py's "
        "other_writers example (the commits named)",
    "tests/test_proof_matrix.py::test_exactly_once_is_clean[mid-sink-write]":
        "tests/test_sinks_exactly_once.py::test_every_sink_is_exactly_once_through_every_crash_point (a MERGE, a Kafka "
        "and a Parquet write SIGKILLed mid-write, each sink 0/0/0)",
    "tests/test_proof_matrix.py::test_kill_mid_write_leaves_nothing_in_the_sink":
        "tests/test_sinks_exactly_once.py::test_after_sink_commit_every_sink_held_the_batch_keyed_and_spark_had_not_"
        "committed (the facts of each mid-write kill: its write begun, the sinks after it not holding the batch)",
    "tests/test_proof_matrix.py::test_matrix_has_every_cell":
        "tests/test_proof_matrix.py::test_after_sink_commit_kill_lands_between_sink_and_commit_log (its one crash in "
        "batch 1) and tests/test_matrix_cells.py::test_a_matrix_whose_every_cell_is_as_expected_passes",
    "tests/test_proof_matrix.py::test_every_cell_shows_exactly_the_damage_its_guarantee_predicts":
        "tests/test_proof_matrix.py::test_at_least_once_duplicates_after_sink_commit_and_never_loses and tests/test_"
        "matrix_cells.py::test_every_cell_not_as_expected_fails_the_matrix_with_which_and_why",
    "tests/test_kafka_cluster.py::test_a_pipeline_on_the_cluster_rides_out_each_node_fault_and_every_sink_reconciles":
        "tests/test_kafka_cluster.py::test_a_transaction_through_a_broker_fault_commits_once_and_its_replay_writes_"
        "nothing (the Kafka sink's own transaction through each node fault, mid-write, and its replay)",
    "examples/your_code/tests/test_shop.py::test_shop_orders_are_exactly_once_through_crashes":
        "tests/test_foreach_batch.py::test_the_textbook_ledger_runs_unchanged_its_duplicate_is_found_and_its_lost_"
        "checkpoint_refused (the shop's code through SIGKILLs) and tests/test_testing_plugin.py (the plugin's prove "
        "through a kill)",
    "tests/test_your_code.py::test_a_replay_joins_the_version_its_first_attempt_joined":
        "tests/test_your_code.py::test_a_replayed_batch_reads_its_recorded_lookup_version_when_pinned (the pin's rule) "
        "and tests/test_replay_through.py::test_restoring_an_older_backup_replays_the_batches_the_sinks_hold_and_"
        "writes_nothing_twice (a backup restored behind the sinks, replayed)",
    "tests/test_files_source.py::test_files_source_is_exactly_once_through_a_crash_and_reads_new_files_only":
        "streamproof/__init__.py's example (a folder of files killed after the sink's commit, later files read, "
        "verified) and tests/test_files_source.py::test_a_file_s_lines_are_numbered_from_1_a_blank_line_is_a_record_"
        "and_a_final_newline_is_not",
    "tests/test_crash_recovery.py::test_two_random_sigkills_lose_nothing_and_duplicate_nothing":
        "tests/test_testing_plugin.py::test_user_records_go_through_a_random_kill_as_given",
    "tests/test_nemesis.py::test_a_small_nemesis_drawn_from_a_seed_pauses_resumes_and_ends_clean":
        "tests/test_nemesis.py::test_a_replay_bug_planted_in_the_pipeline_is_found_by_replaying_its_sequence",
    "tests/test_bench.py::test_throughput_benchmark_writes_its_results_with_same_run_ratios":
        "tests/test_bench.py's units of ratios and phases (`streamproof bench` is the benchmark)",
    "tests/test_examples.py::test_example_runs_and_reconciles[orders_avro_to_delta]":
        "tests/test_avro.py::test_an_avro_pipeline_from_a_registry_survives_a_kill_mid_write",
    "tests/test_examples.py::test_example_runs_and_reconciles[customer_totals_to_postgres]":
        "tests/test_sinks_exactly_once.py::test_every_sink_is_exactly_once_through_every_crash_point (its pg-totals) "
        "and tests/test_sinks_exactly_once.py::test_a_batch_of_null_amounts_adds_0_and_never_poisons_a_running_total",
    "tests/test_your_code.py::test_your_sinks_get_the_guarantee_their_code_gives":
        "tests/test_foreach_batch.py::test_the_textbook_ledger_runs_unchanged_its_duplicate_is_found_and_its_lost_"
        "checkpoint_refused (your sink's moments crashed, its duplicate found) and tests/test_matrix_cells.py::"
        "test_your_sinks_exactly_once_cell_with_damage_fails_the_matrix_saying_which_guarantee_it_gave",
    "tests/test_standby.py::test_a_run_warmed_up_on_generated_records_then_reads_its_topic_exactly_once":
        "tests/test_standby.py::test_a_warm_standby_takes_over_a_killed_pipeline_and_skips_the_batch_its_sink_had_"
        "committed (a warm-up that leaves nothing in the pipeline's tables)",
    "tests/test_pipeline_end_to_end.py::test_negative_control_one_duplicate_and_one_loss_are_reported":
        "tests/test_sinks_exactly_once.py::test_both_checkers_agree_after_the_kills_and_both_catch_a_planted_defect_"
        "in_every_sink_kind",
    "tests/test_nemesis.py::test_a_replay_bug_planted_in_the_pipeline_is_found_by_replaying_its_sequence":
        "tests/test_replay_through.py::test_restoring_an_older_backup_replays_the_batches_the_sinks_hold_and_writes_"
        "nothing_twice (the replay rule on a backup restored behind the sinks)",
    "tests/test_dedup.py::test_dedup_is_exactly_once_through_a_crash[after-sink-commit]":
        "tests/test_windows.py::test_windows_are_written_once_through_a_crash (the dedup-then-windows pipeline through "
        "the same kill)",
    "tests/test_dedup.py::test_every_record_is_accounted_for_after_the_crash[after-sink-commit]":
        "tests/test_windows.py::test_windows_are_written_once_through_a_crash (every identity term checked)",
    "tests/test_dedup.py::test_late_records_dropped_by_configuration_are_counted":
        "tests/test_checker.py::test_late_records_dropped_by_configuration_are_counted_and_expected_nowhere",
    "tests/test_examples.py::test_partitioned_example_survives_kills_mid_write_and_compacts_per_partition":
        "tests/test_sink_idempotency.py::test_a_partitioned_delta_sink_writes_its_partitions_and_a_merge_reads_only_"
        "the_batch_s and tests/test_sinks_exactly_once.py::test_every_sink_is_exactly_once_through_every_crash_point "
        "(a MERGE killed in its write)",
    "tests/test_outages.py::test_postgres_restart_mid_run_is_survived":
        "tests/test_outages.py::test_an_outage_longer_than_the_bound_stops_cleanly_and_the_next_run_resumes "
        "(PostgreSQL away mid-run: the run's retries seen, then the next run resumes from its checkpoint, 0/0/0)",
    "tests/test_outages.py::test_kafka_broker_restart_mid_run_is_survived":
        "tests/test_kafka_cluster.py::test_a_transaction_through_a_broker_fault_commits_once_and_its_replay_writes_"
        "nothing[leader] (a Kafka node SIGKILLed under a write and started again: the write commits once) and tests/"
        "test_outages.py::test_an_outage_longer_than_the_bound_stops_cleanly_and_the_next_run_resumes (a server "
        "away mid-run, the run's retries, the next run resumes)",
    "tests/test_sinks_exactly_once.py::test_at_most_once_loses_and_never_duplicates":
        "tests/test_proof_matrix.py::test_at_least_once_duplicates_after_sink_commit_and_never_loses (a weaker "
        "guarantee shows the damage it allows) and tests/test_matrix_cells.py::test_every_cell_not_as_expected_fails_"
        "the_matrix_with_which_and_why",
    "tests/test_s3.py::test_two_processes_committing_one_delta_version_on_s3_both_land_one_after_the_other":
        "tests/test_s3.py::test_a_pipeline_on_s3_survives_a_kill_after_its_commit_and_a_second_process_is_refused_by_"
        "the_store (its Delta commits through the same conditional LogStore) and tests/test_s3.py::test_sixteen_"
        "creates_of_one_key_racing_on_the_store_have_exactly_one_winner",
    "tests/test_s3.py::test_checkpoint_commands_and_maintenance_work_on_s3":
        "tests/test_checkpoint_recovery.py::test_lost_and_damaged_checkpoints_are_refused_then_rebuilt_from_the_sinks "
        "(the same commands) and tests/test_s3.py::test_a_pipeline_on_s3_survives_a_kill_after_its_commit_and_a_"
        "second_process_is_refused_by_the_store (the checkpoint and table on S3 through a kill, both checkers)",
    "tests/test_examples.py::test_example_runs_and_reconciles[orders_to_delta_merge+orders_to_files+orders_to_kafka+"
    "orders_to_postgres]":
        "tests/test_config.py::test_every_example_pipeline_loads (each example a valid pipeline) and tests/test_sinks_"
        "exactly_once.py::test_every_sink_is_exactly_once_through_every_crash_point (these examples' sinks, Delta "
        "MERGE, PostgreSQL upsert, Kafka and files, through SIGKILLs, both checkers)",
    "tests/test_testing_plugin.py::test_user_records_go_through_a_random_kill_as_given":
        "tests/test_avro.py::test_an_avro_pipeline_from_a_registry_survives_a_kill_mid_write (the plugin's prove "
        "through a SIGKILL, as a user calls it) and tests/test_testing_plugin.py::test_guarantee_check_fails_with_"
        "exact_counts (its judgement); random kills: tests/test_crash_recovery.py, in this tier",
    "tests/test_readme.py::test_the_from_python_example_runs_as_written":
        "tests/test_readme.py::test_the_from_python_example_calls_streamproof_as_it_is (the example's calls, checked "
        "without a JVM) and streamproof/__init__.py's example (Pipeline, run, prove through a SIGKILL after the sink's "
        "commit, verify: the same calls, run)",
    "tests/test_compacted_markers.py::test_a_restored_batch_whose_marker_the_cleaner_compacted_is_not_produced_twice":
        "tests/test_compacted_markers.py::test_a_share_whose_marker_was_compacted_away_is_held_by_its_source_"
        "partition_s_later_marker (the same markers, the cleaner's work stood for by leaving the compacted ones out)",
    "tests/test_checkpoint_recovery.py::test_a_sink_that_goes_backwards_while_the_pipeline_runs_stops_it":
        "tests/test_other_writers.py::test_a_table_dropped_and_created_again_to_the_same_version_under_a_running_sink_"
        "stops_it (a Delta table changed under a running sink: stopped before its next batch, one line) and tests/test_"
        "checkpoint_recovery.py::test_lost_and_damaged_checkpoints_are_refused_then_rebuilt_from_the_sinks (the start "
        "refusal of a sink behind, and the rewind)",
    "tests/test_stop_signals.py::test_max_batches_stops_after_that_many_batches_and_verify_counts_the_rest_not_yet_read":
        "tests/test_replay_through.py::test_restoring_an_older_backup_replays_the_batches_the_sinks_hold_and_writes_"
        "nothing_twice (`run --max-batches 2` as a user types it, then reconciled) and tests/test_identity.py::test_"
        "records_not_yet_read_are_a_term_of_their_own_and_never_change_the_verdict (the term, without a JVM)",
    "tests/test_sink_idempotency.py::test_min_partitions_raised_after_a_kill_writes_nothing_twice":
        "tests/test_sink_idempotency.py::test_a_batch_replayed_split_otherwise_is_never_written_twice (each per-task "
        "sink's own write: a batch held whole and split otherwise skipped, one held in part refused, then completed, "
        "every record once)",
    "tests/test_cluster.py::test_checkpoint_commands_work_on_hdfs":
        "tests/test_checkpoint_recovery.py::test_lost_and_damaged_checkpoints_are_refused_then_rebuilt_from_the_sinks "
        "(the same commands) and tests/test_cluster.py::test_every_sink_is_exactly_once_through_the_cluster_faults "
        "(the checkpoint on HDFS through three faults)",
}  # fmt: skip


# A run writes a few GiB under the temporary folder (brokers' logs, Delta tables, S3's volumes); on a disk nearly full
# its servers fail without naming the disk (SeaweedFS: "Not enough data nodes found"; a broker that never answers).
FREE_DISK_NEEDED = 4 * 2**30


def free_disk_refusal(folder: Path, needed: int = FREE_DISK_NEEDED) -> str | None:
    """One line when the disk of ``folder`` has less than ``needed`` bytes free, else None."""
    free = shutil.disk_usage(folder).free
    if free >= needed:
        return None
    return (
        f"only {free / 2**30:.1f} GiB free on the disk of {folder}: the suite needs about {needed / 2**30:.0f} GiB, "
        "and its servers fail without naming the disk; free some (`uv cache prune` removes the wheels uv keeps for "
        "every install)"
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to start on a disk nearly full, in one line (:func:`free_disk_refusal`)."""
    if (why := free_disk_refusal(Path(tempfile.gettempdir()))) is not None:
        pytest.exit(why, returncode=3)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The suite's JVM temporary files removed (:data:`SUITE_TEMPORARY_FILES`), by the process that made the folder,
    once no process started with it runs (a JVM still exiting deletes its own; 60 s at most)."""
    if SUITE_TEMPORARY_FILES is None:
        return
    deadline = time.monotonic() + 60
    while _processes_using(SUITE_TEMPORARY_FILES) and time.monotonic() < deadline:
        time.sleep(0.5)
    shutil.rmtree(SUITE_TEMPORARY_FILES, ignore_errors=True)


def _processes_using(folder: Path) -> list[int]:
    """The pids whose command line names ``folder``."""
    return [pid for pid in process_table() if str(folder) in process_cmdline(pid)]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run the slow tier (tests/conftest.py SLOW_TIER)")


# The files of the longest tests, longest first (the durations of a clean-clone run, 2026-11-28): pytest-xdist's
# loadfile hands files out in collection order, so the longest start first and no worker is left alone with one
# at the end (the last run's tail: 27 s of one idle core).
LONGEST_FILES_FIRST = (
    "tests/test_jobs.py",
    "tests/test_cluster.py",
    "tests/test_checkpoint_recovery.py",
    "tests/test_sinks_exactly_once.py",
    "tests/test_s3.py",
    "tests/test_sink_idempotency.py",
    "tests/test_replay_through.py",
    "tests/test_delta_source.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the slow tier out unless ``--slow`` (``make test-all``); a test named on the command line runs. The
    longest files first (:data:`LONGEST_FILES_FIRST`), the rest in their order."""
    rank = {path: index for index, path in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order
    if config.getoption("--slow"):
        return
    named = {arg.split("::")[0] for arg in config.args if "::" in arg}
    slow = [item for item in items if item.nodeid in SLOW_TIER and item.nodeid.split("::")[0] not in named]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]


def write_pipeline(workdir: Path, *, name: str, topic: str, bootstrap: str, max_offsets: int) -> Path:
    """The demo's pipeline (the one users see first), with checkpoint and tables under ``workdir``."""
    return write_demo_pipeline(workdir, topic, bootstrap, max_offsets, name=name)


# The data of the dedup and window tests: 12,000 records, 3% resends, 1% events 6 hours late, 0.5% malformed.
STATEFUL_EVENTS = 12_000
STATEFUL_DATA = {"malformed": 0.005, "duplicates": 0.03, "late": 0.01}


def stateful_example(workdir: Path, broker: str, topic: str, late: str = "quarantine",
                     example: str = "orders_dedup_to_delta.toml") -> Path:  # fmt: skip
    """The example on the test broker, 1-minute delay (and windows of 1 minute per status), 4,000-record
    batches (three of :data:`STATEFUL_EVENTS`), its own folders."""
    from streamproof.config import dump_pipeline, load_pipeline

    spec = load_pipeline(REPO / "examples" / example)
    dedup = spec.transform.dedup
    assert dedup is not None and spec.sink is not None
    aggregate = spec.transform.aggregate
    if aggregate is not None:
        aggregate = aggregate.model_copy(update={"window": "1 minute", "by": ["status"]})
    spec = spec.model_copy(update={
        "checkpoint": str(workdir / "checkpoint"),
        "source": spec.source.model_copy(update={"bootstrap_servers": broker, "topic": topic,
                                                 "max_offsets_per_trigger": 4_000}),
        "transform": spec.transform.model_copy(update={
            "quarantine": str(workdir / "quarantine"),
            "dedup": dedup.model_copy(update={"delay": "1 minute", "late": late}),
            "aggregate": aggregate,
        }),
        "sink": spec.sink.model_copy(update={"path": str(workdir / "orders")}),
    })  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "pipeline.toml"
    path.write_text(dump_pipeline(spec))
    return path


# Three batches of one partition (offsets 0-2, 3-5, 6-7); the watermark logged for batch 0 is 0, for batch 1 00:10,
# for batch 2 00:11. Spark judges batch N's late records by batch N-1's watermark: with these event times (one per
# offset 0-8) only offset 6 (00:10, at the watermark, in batch 2) is late; offset 8 is beyond the last batch.
LATE_TIMES = ["00:20", "00:00", "00:05", "00:01", "00:09", "00:20", "00:10", "00:10:00.001", "00:00"]


def late_checkpoint(workdir: Path) -> Any:
    """A dedup pipeline whose checkpoint holds :data:`LATE_TIMES`' three batches (written by hand)."""
    from streamproof.config import parse_pipeline

    checkpoint = workdir / "cp"
    (checkpoint / "offsets").mkdir(parents=True)
    ten_past = 1767226200000  # 2026-01-01T00:10:00Z
    for batch_id, (watermark, end) in enumerate([(0, 3), (ten_past, 6), (ten_past + 60_000, 8)]):
        metadata = json.dumps({"batchWatermarkMs": watermark, "batchTimestampMs": 0, "conf": {}})
        (checkpoint / "offsets" / str(batch_id)).write_text(f'v1\n{metadata}\n{{"t":{{"0":{end}}}}}')
    return parse_pipeline(f'''
name = "late"
checkpoint = "{checkpoint}"
[source]
kind = "kafka"
topic = "t"
[transform]
schema = "event_id STRING, event_time TIMESTAMP"
dedup = {{ columns = ["event_id"], watermark = "event_time", delay = "1 minute" }}
[sink]
kind = "delta"
path = "{workdir / "sink"}"
''')


# A checkpoint whose offset log starts at batch 3 (Spark kept the last batches only), one partition: batch 3 ends at
# offset 6 with watermark 00:10, batch 4 reads 6-8 (judged by 00:10), batch 5 reads 9-11 (judged by 00:11). Batches
# 0-3 (offsets 0-5) are gone: a record of theirs newer than 00:10 was not late (0, 3, 5), an older one may have been
# (1, 2, 4: at 00:10 counts); of the logged batches' records 6 and 9 were late (at or before their watermark).
UNLOGGED_TIMES = ["00:20", "00:05", "00:09", "00:30", "00:10", "00:15", "00:10", "00:10:00.001", "00:20", "00:11",
                  "00:12", "00:13"]  # fmt: skip


def unlogged_checkpoint(workdir: Path, late: str) -> Any:
    """A dedup pipeline (``dedup.late = late``, a Delta sink at ``workdir/sink``) whose offset log holds only batches
    3-5 of :data:`UNLOGGED_TIMES` (written by hand, as Spark leaves it after purging the older entries)."""
    from streamproof.config import parse_pipeline

    checkpoint = workdir / "cp"
    (checkpoint / "offsets").mkdir(parents=True)
    ten_past = 1767226200000  # 2026-01-01T00:10:00Z
    for batch_id, watermark, end in [(3, ten_past, 6), (4, ten_past + 60_000, 9), (5, ten_past + 120_000, 12)]:
        metadata = json.dumps({"batchWatermarkMs": watermark, "batchTimestampMs": 0, "conf": {}})
        (checkpoint / "offsets" / str(batch_id)).write_text(f'v1\n{metadata}\n{{"t":{{"0":{end}}}}}')
    return parse_pipeline(f'''
name = "unlogged"
checkpoint = "{checkpoint}"
[source]
kind = "kafka"
topic = "t"
[transform]
schema = "event_id STRING, event_time TIMESTAMP"
dedup = {{ columns = ["event_id"], watermark = "event_time", delay = "1 minute", late = "{late}" }}
[sink]
kind = "delta"
path = "{workdir / "sink"}"
''')


def assert_every_sink_clean(spark: Any, pipeline_file: Path, events: int) -> list[Any]:
    """Reconcile the drained pipeline's sinks: each 0 lost / 0 duplicated / 0 unexpected over ``events`` source records,
    every one of them read (none set apart as not yet read)."""
    from streamproof.config import load_pipeline
    from streamproof.reconcile import verify_pipeline

    reports = verify_pipeline(spark, load_pipeline(pipeline_file))
    for report in reports:
        assert report.source_records == events
        damage = (report.lost, report.duplicated, report.unexpected, report.not_yet_read)
        assert damage == (0, 0, 0, 0), report.to_json()
        assert report.identity_holds
    return reports


def taken_over_after_reading(read: Callable[..., Any], take_over: Callable[[], None]) -> Callable[..., Any]:
    """``read`` (a record's newest entry) followed at once by another run's takeover: a woken run's read made before
    the takeover, its write after it (tests of :class:`streamproof.storage.claimed_log.ClaimedLog`'s users)."""

    def read_then_taken_over(*args: Any) -> Any:
        before = read(*args)
        take_over()
        return before

    return read_then_taken_over


def run_lock_holder(checkpoint: Path, lease_s: float, seconds: float, host: str | None = None) -> subprocess.Popen[str]:
    """tests/data/hold_run_lock.py: a process taking ``checkpoint``'s run lock as a run does (lease ``lease_s``),
    holding it ``seconds``; it prints one line as soon as it holds or is refused. On ``host``: :func:`on_host`."""
    command = [sys.executable, str(REPO / "tests" / "data" / "hold_run_lock.py"), str(checkpoint), str(lease_s),
               str(seconds)]  # fmt: skip
    if host is not None:
        command = on_host(host, command)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)  # fmt: skip


def on_host(host: str, command: list[str]) -> list[str]:
    """``command`` run as on another machine: UTS and PID namespaces of its own, named ``host`` (as root)."""
    from streamproof.harness.child import on_another_host

    return on_another_host(host, command)


def wait_for_line(child: subprocess.Popen[str], text: str, timeout_s: float = 300) -> None:
    """Read a running process's output until a line holding ``text``, within ``timeout_s`` (a process that stalls
    without a line fails too: the lines are read by a thread of their own); its output ending first fails."""
    stdout = child.stdout
    assert stdout is not None
    found: queue.Queue[bool] = queue.Queue()

    def read() -> None:
        for line in stdout:
            if text in line:
                found.put(True)
                return
        found.put(False)

    threading.Thread(target=read, name=f"wait-for-{text}", daemon=True).start()
    try:
        if found.get(timeout=timeout_s):
            return
    except queue.Empty:
        raise AssertionError(f"no {text!r} within {timeout_s:g} s") from None
    raise AssertionError(f"the output ended without {text!r}: {child.stderr.read() if child.stderr else ''}")


def wait_for_a_committed_batch(child: subprocess.Popen[str], timeout_s: float = 300) -> None:
    """Read a running pipeline's output until its first batch line (`` committed: ``), within ``timeout_s``."""
    wait_for_line(child, " committed: ", timeout_s)


def drain_in_process(pipeline_file: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``streamproof run PIPELINE --available-now`` as the command calls it, in this process on its session; the
    lines it would print. A JVM start saved, for a test whose claim is not the command's own process (the crashed
    runs stay processes, SIGKILLed). Spark's log file is this run's own, never inherited by a later child process."""
    from streamproof.config import load_pipeline
    from streamproof.jvm.session import SPARK_LOG_ENV
    from streamproof.pipeline.query import run

    monkeypatch.setenv(SPARK_LOG_ENV, str(pipeline_file.parent / "logs" / "spark-in-process.log"))
    lines: list[str] = []
    run(load_pipeline(pipeline_file), available_now=True, on_event=lambda event: lines.append(event.line()))
    return "\n".join(lines)


def run_cli(
    *args: str, timeout: float = CLI_TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m streamproof ARGS`` as a separate process, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "streamproof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


# The broker and Spark fixtures are the ones streamproof ships to its users (streamproof/testing.py),
# so the project's own tests exercise the plugin too.
@pytest.fixture(scope="session")
def kafka_broker(streamproof_kafka: KafkaBroker) -> KafkaBroker:
    """A real Apache Kafka (KRaft) broker on free ports, stopped and wiped at the end of the session."""
    return streamproof_kafka


@pytest.fixture(scope="session")
def spark(streamproof_spark: object) -> object:
    """The test process's SparkSession (streamproof defaults: cached jars, Delta, local[2])."""
    return streamproof_spark


def tree_bytes(folder: Location, skip: str = "") -> dict[str, bytes]:
    """Every file under ``folder`` (but ``skip``), by its path inside it, with its bytes."""
    files: dict[str, bytes] = {}
    for name in folder.names():
        if name == skip:
            continue
        if (folder / name).is_dir():
            files |= {f"{name}/{path}": data for path, data in tree_bytes(folder / name, skip).items()}
        else:
            files[name] = (folder / name).read_bytes()
    return files


def plant_delta_commit(log: Path, version: int, *, pipeline: str, batch_id: int, end_offsets: dict[str, Any]) -> Path:
    """Write ``log``'s commit file of ``version`` as a streamproof batch commit would leave it, without Spark: the
    pipeline's transaction (``txn``, app id ``streamproof/<pipeline>``) and the record of the batch in
    ``commitInfo.userMetadata``, the two actions the Delta sink reads back. Returns the file."""
    record = {"streamproof": {"pipeline": pipeline, "batch_id": batch_id, "end_offsets": end_offsets}}
    actions = [
        {"txn": {"appId": f"streamproof/{pipeline}", "version": batch_id}},
        {"commitInfo": {"userMetadata": json.dumps(record)}},
    ]
    log.mkdir(parents=True, exist_ok=True)
    path = log / f"{version:020d}.json"
    path.write_text("\n".join(json.dumps(action) for action in actions))
    return path
