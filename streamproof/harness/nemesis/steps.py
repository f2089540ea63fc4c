"""The steps of a nemesis (:mod:`streamproof.harness.nemesis`). Each is one thing a user or the world does (Jepsen's
nemesis, on streamproof's own commands), and a method of :class:`NemesisSteps` named after it (``lose-commits``:
``_lose_commits``), which :meth:`~streamproof.harness.nemesis.Nemesis.apply` finds by that name:

=================  ==============================================================================================
``kill@A:P``       a run SIGKILLed (its whole process tree) ``P`` of a batch's duration after its ``A``-th batch
``term@A``         a run stopped by SIGTERM after its ``A``-th batch (it finishes the batch in flight, exits 0)
``drain``          a run to the end of the topic (``run --available-now``)
``standby@A``      a run and a warm standby beside it; the run SIGKILLed after its ``A``-th batch, the standby takes
                   over and drains
``broker@A``       the Kafka broker stopped for 3 s after a run's ``A``-th batch; the run rides it out
``postgres@A``     PostgreSQL stopped for 3 s after a run's ``A``-th batch; the run rides it out
``s3@A``           the S3 server SIGKILLed after a run's ``A``-th batch (a write in flight), started again 3 s later
``s3-slow@A``      S3 answers ``503 SlowDown`` to every request for 3 s after a run's ``A``-th batch (its open
                   connections reset first)
``s3-reset@A``     S3's connections reset, and each new one, for 3 s after a run's ``A``-th batch
``s3-lost-answer@A`` the conditional writes (If-None-Match) of the 3 s after a run's ``A``-th batch, 3 at most, carried
                   out by the store and their answers dropped (the writer's connection reset): each writer must find
                   its own object, not a conflict
``s3-conflict@A``  the conditional writes of those 3 s, 3 at most, answered ``409 ConditionalRequestConflict``: retried
``leader@A``      on a Kafka cluster: the node leading partition 0 of the topic the pipeline writes (its Kafka sink's,
                   else its source) SIGKILLed after a run's ``A``-th batch, as the next one writes; started again 3 s
                   later (a node that exits while starting is started again, as a supervisor would), and the step
                   waits until every replica is back in sync
``controller@A``  on a Kafka cluster: the active KRaft controller SIGKILLed likewise
``pause@A``       on a Kafka cluster: that leader paused (SIGSTOP) 9 s, past the cluster's 6-s session timeout (it is
                   fenced, its partitions led elsewhere), then resumed (SIGCONT): a zombie leader until it learns
``table-restore:N`` another writer RESTOREs the Delta sink table to the version before its pipeline's ``N``-th newest
                   commit (undoing ``N`` batches; Spark's ``RESTORE TABLE``); the run refuses naming ``checkpoint
                   rewind`` (then run), or replays what it lost
``optimize@A``    another writer's maintenance beside a run, after its ``A``-th batch: OPTIMIZE, then VACUUM (its
                   default retention), of each Delta sink table, from the nemesis's own Spark session; a MERGE whose
                   commit the OPTIMIZE beat runs again
``moved@A``        a run SIGKILLed (its whole process tree) after its ``A``-th batch, then started on another host (UTS
                   and PID namespaces of its own, as root): it waits out the dead run's lease (3 s in these steps) and
                   takes over by itself, nobody removing a file
``other-host@A``   while a run goes on past its ``A``-th batch, one started on another host: it watches the lease, sees
                   it renewed and is refused in one line (or runs, when the first ended meanwhile); the first runs on
``driver-pause@A`` a run's whole process tree SIGSTOPped after its ``A``-th batch, past its lease; another host takes
                   over and drains; the first, continued, stops in one line naming the lease it lost (or ends with
                   nothing left to write)
``s3-multipart``   a multipart upload of the Delta table's next commit begun and abandoned (a writer that died in it)
``backup``         ``checkpoint backup`` of the stopped pipeline
``restore:I``      ``checkpoint restore`` of backup ``I`` (0: the oldest; taken modulo the backups there are)
``lose-checkpoint`` the checkpoint deleted; the run refuses; ``checkpoint recover``
``lose-commits:N`` a Delta sink's newest ``N`` commits of the pipeline gone (its storage went backwards); the run
                   refuses, or replays what it lost; ``checkpoint rewind`` when it refuses
``executor``       on a cluster: the executor running a sink write's last task SIGKILLed halfway (Spark retries the
                   task); the run survives it and drains
``datanode``       on a cluster with HDFS: the DataNode SIGKILLed while a write streams into it, started again a
                   second later; the run survives it and drains
=================  ==============================================================================================

A step runs the pipeline (:mod:`~streamproof.harness.nemesis.runs`) and has each run's exit judged
(:mod:`~streamproof.harness.nemesis.judgement`). Whether it applies: :meth:`NemesisSteps.supports` (this set-up has
what it acts on) and :meth:`NemesisSteps.can` (and the live state allows it now).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable

from streamproof.checkpoint.copies import kept_aside
from streamproof.checkpoint.folder import LEASE_ENV
from streamproof.checkpoint.log import committed_batches
from streamproof.config import DeltaSinkSpec, KafkaSinkSpec
from streamproof.faults.points import DATANODE_RESTART, EXECUTOR_MID_WRITE, kill_process_tree
from streamproof.harness.child import PipelineChild, other_hosts_possible
from streamproof.harness.crashes import run_with_crashes
from streamproof.harness.daemons import KafkaFaults, kafka_up_supervised, maintain_delta_tables, restore_behind
from streamproof.harness.matrix import cluster_points
from streamproof.harness.nemesis.judgement import NemesisJudgement
from streamproof.harness.nemesis.runs import NemesisFailure
from streamproof.harness.sequence import HOST_STEPS, Step, state_allows
from streamproof.infra.fault_proxy import FaultProxy
from streamproof.pipeline.events import STANDBY
from streamproof.sinks.delta_log import commit_file, latest_version, pipeline_commit
from streamproof.storage.location import Location

MACHINE_FAULTS = {"executor": EXECUTOR_MID_WRITE, "datanode": DATANODE_RESTART}
OTHER_HOST = "nemesis-b"  # the hostname of the host steps' other "machine"
SHORT_LEASE = {LEASE_ENV: "3"}  # the host steps' runs: another host takes over 4 s after a renewal stopped
OUTAGE_S = 3.0
CONDITIONAL_FAULTS = 3  # s3-lost-answer, s3-conflict: the conditional writes met, at most
S3_OUTAGES = ("s3", "s3-slow", "s3-reset", "s3-lost-answer", "s3-conflict")
PAUSE_S = 9.0  # a paused Kafka node: longer than the cluster's broker.session.timeout.ms (6 s)


class NemesisSteps(NemesisJudgement):
    """Every step of the table, and whether it applies."""

    def supports(self, action: str) -> bool:
        """Whether this set-up has what ``action`` acts on (its server, a Delta sink, a cluster), whatever the state."""
        return {
            "broker": self.daemons.broker is not None,
            "postgres": self.daemons.postgres is not None,
            **dict.fromkeys(("leader", "controller", "pause"), self.daemons.kafka_cluster is not None),
            **dict.fromkeys(S3_OUTAGES, self.daemons.s3 is not None),
            "s3-multipart": self.daemons.s3 is not None and self._delta_sink() is not None,
            **dict.fromkeys(HOST_STEPS, other_hosts_possible()),
            # A checkpoint rebuilt from the sinks' records starts dedup's and windows' state empty (docs/operations.md):
            # resent records seen before the loss pass again. Not a step for a stateful pipeline.
            "lose-checkpoint": self.spec.transform.watermark is None,
            "lose-commits": self._delta_sink() is not None,
            "optimize": self._delta_sink() is not None,
            "table-restore": self._delta_sink() is not None,
            "executor": self.daemons.cluster is not None and self.daemons.cluster.spark is not None,
            "datanode": self.daemons.cluster is not None
            and DATANODE_RESTART in cluster_points(self.spec, self.daemons.cluster),
        }.get(action, True)

    def can(self, action: str) -> bool:
        """Whether ``action`` applies now: supported, and the live state allows it (a backup needs a checkpoint with
        batches, a restore a backup: :func:`streamproof.harness.sequence.state_allows`)."""
        has_batches = bool(committed_batches(self.spec.checkpoint_dir))
        return self.supports(action) and state_allows(action, has_batches=has_batches, backups=len(self.backups))

    def _kill(self, step: Step) -> None:
        child = self._start()
        if not self._after_batches(child, step.after):
            return self._ended(step, child, "the run ended before its batches: no kill")
        last = child.batches()[-1][1]
        time.sleep(step.phase * max(last.duration_s, 0.2))
        child.kill_tree()
        code = child.wait(60)
        landed = code == -signal.SIGKILL
        self._say(
            step,
            f"SIGKILL {'in batch ' + str(last.batch_id + 1) if landed else 'missed'} (run {self.runs}, exit {code})",
        )
        child.close()
        if not landed:
            self._judge_exit(step, child, code)

    def _term(self, step: Step) -> None:
        child = self._start()
        if self._after_batches(child, step.after):
            child.terminate()
        self._ended(step, child, "SIGTERM")

    def _drain(self, step: Step) -> None:
        self._ended(step, self._start(), "drained")

    def _standby(self, step: Step) -> None:
        holder = self._start(available_now=False)
        # The standby starts once the holder has the run lock (its first batch is committed): started together,
        # either may take the lock first, and a holder that finds the standby running as the pipeline is refused.
        holder.wait_for(lambda: bool(holder.batches()) or holder.process.poll() is not None, 300, "a batch")
        if holder.process.poll() is not None:  # refused at its start, say: a standby now would only meet that refusal
            return self._ended(step, holder, "the run ended before its first batch: no standby started")
        standby = PipelineChild(self.cell_file, self.workdir / "logs", name=f"run-{self.runs}-standby", standby=True)
        self._children.append(standby)
        standby.wait_for(
            lambda: (
                any("waiting for pid" in text for text in standby.notices(STANDBY))
                or standby.process.poll() is not None
            ),
            300,
            "the standby warm and waiting",
        )
        self._after_batches(holder, step.after)
        if holder.process.poll() is not None:  # it ended before the kill: the standby takes over the state it left
            return self._ended_before_the_kill(step, holder, standby)
        holder.kill_tree()
        holder.close()
        self._ended(step, standby, f"holder SIGKILLed after {len(holder.batches())} batches; the standby took over")

    def _ended_before_the_kill(self, step: Step, holder: PipelineChild, standby: PipelineChild) -> None:
        """Both runs judged: the holder's exit first, then the standby's, which took over the state the holder left,
        unless it met the holder's very refusal. That refusal is repaired once: a second put-back of the checkpoint a
        restore replaced finds none to put back (found at step 175 of a 300-step run)."""
        code = holder.wait(60)
        holder.close()
        standby_code = standby.wait(900)
        standby.close()
        self._say(
            step,
            f"the holder ended before the kill (exit {code}); the standby took over: "
            f"{len(standby.batches())} batches, exit {standby_code} (run {self.runs})",
        )
        self._judge_exit(step, holder, code)
        if code == standby_code != 0 and standby.error_line() == holder.error_line():
            self._say(step, f"the standby met the holder's refusal (exit {standby_code}): repaired once, above")
            return
        self._judge_exit(step, standby, standby_code)

    def _broker(self, step: Step) -> None:
        broker = self.daemons.broker
        assert broker is not None
        self._outage(step, broker.down, lambda: self._say_if(step, kafka_up_supervised(broker)))

    def _leader(self, step: Step) -> None:
        self._node_fault(step, lambda nodes: nodes.kill_leader(self._written_topic()), OUTAGE_S)

    def _controller(self, step: Step) -> None:
        self._node_fault(step, lambda nodes: nodes.kill_controller(), OUTAGE_S)

    def _pause(self, step: Step) -> None:
        self._node_fault(step, lambda nodes: nodes.pause_leader(self._written_topic(), PAUSE_S), 0.0)

    def _node_fault(self, step: Step, fault: Callable[[KafkaFaults], str], down_s: float) -> None:
        """A Kafka cluster's node faulted while the run's next batch writes, the node back after ``down_s``, the run
        riding it out."""
        nodes = self.daemons.kafka_cluster
        assert nodes is not None
        back = f"the node back after {down_s:.0f} s, in sync" if down_s else "the node resumed, in sync"
        restore = lambda: self._say_if(step, nodes.restore())  # noqa: E731
        self._outage(step, lambda: self._say(step, fault(nodes)), restore, down_s, outage=back)

    def _optimize(self, step: Step) -> None:
        maintain = lambda: self._say(step, maintain_delta_tables(self.spark, self.spec))  # noqa: E731
        self._outage(step, maintain, lambda: None, 0.0, outage="beside the run")

    def _written_topic(self) -> str:
        """The topic whose leader a node fault aims at: the Kafka sink's, else the source's."""
        written = [sink.topic for sink in self.spec.sink_specs if isinstance(sink, KafkaSinkSpec)]
        return written[0] if written else self.topic

    def _postgres(self, step: Step) -> None:
        assert self.daemons.postgres is not None
        self._outage(step, self.daemons.postgres.down, self.daemons.postgres.up)

    def _s3(self, step: Step) -> None:
        assert self.daemons.s3 is not None
        self._outage(step, self.daemons.s3.kill, self.daemons.s3.restart)

    def _s3_slow(self, step: Step) -> None:
        self._s3_fault(step, "slow-down")

    def _s3_reset(self, step: Step) -> None:
        self._s3_fault(step, "reset")

    def _s3_fault(self, step: Step, fault: str) -> None:
        self._through_the_proxy(step, lambda proxy: proxy.fail(fault, OUTAGE_S), lambda proxy: None, "request")

    def _s3_lost_answer(self, step: Step) -> None:
        self._s3_conditional_fault(step, "drop-answer")

    def _s3_conflict(self, step: Step) -> None:
        self._s3_conditional_fault(step, "conflict")

    def _s3_conditional_fault(self, step: Step, fault: str) -> None:
        self._through_the_proxy(step, lambda proxy: proxy.fail_conditional_puts(fault, CONDITIONAL_FAULTS),
                                lambda proxy: proxy.stop_failing_conditional_puts(), "conditional write",
                                outage=f"the conditional writes of {OUTAGE_S:.0f} s met by {fault}")  # fmt: skip

    def _through_the_proxy(self, step: Step, start: Callable[[FaultProxy], object], end: Callable[[FaultProxy], object],
                           met: str, outage: str = "") -> None:  # fmt: skip
        """An outage made by S3's fault proxy (``start`` it, ``end`` it), and the faults it gave said."""
        assert self.daemons.s3 is not None
        proxy = self.daemons.s3.proxy
        before = Counter(proxy.faults_given)
        self._outage(step, lambda: start(proxy), lambda: end(proxy), outage=outage)
        self._say(step, f"the proxy's faults: {dict(proxy.faults_given - before) or f'none (no {met} came)'}")

    def _moved(self, step: Step) -> None:
        first = self._start(environment=SHORT_LEASE)
        if not self._after_batches(first, step.after):
            return self._ended(step, first, "the run ended before its batches: no kill")
        first.kill_tree()
        first.close()
        self._say(step, f"SIGKILL after {len(first.batches())} batches (run {self.runs}); started on host {OTHER_HOST}")
        second = self._start(host=OTHER_HOST, environment=SHORT_LEASE)
        self._ended(step, second, f"on host {OTHER_HOST}")
        if "took over the run lock" not in second.log_path.read_text(errors="replace"):
            raise NemesisFailure(f"{step.encode()}: the run on host {OTHER_HOST} took over no lock (a dead run's)")

    def _other_host(self, step: Step) -> None:
        first = self._start(available_now=False, environment=SHORT_LEASE)
        if not self._after_batches(first, step.after):
            return self._ended(step, first, "the run ended before its batches: no start on another host")
        second = self._start(host=OTHER_HOST, environment=SHORT_LEASE)
        code = second.wait(300)
        second.close()
        line = second.error_line() or ""
        if code == 2 and "is in use by a running pipeline" in line:
            self._say(step, f"the start on host {OTHER_HOST} refused: {line.removeprefix('error: ')[:120]}")
        elif code == 0:
            self._say(
                step, f"the start on host {OTHER_HOST} ran: the first had ended ({len(second.batches())} batches)"
            )
        else:
            raise NemesisFailure(f"{step.encode()}: the start on host {OTHER_HOST} exited {code}: {line}")
        first.terminate()
        self._ended(step, first, "the first run, SIGTERM")

    def _driver_pause(self, step: Step) -> None:
        first = self._start(environment=SHORT_LEASE)
        if not self._after_batches(first, step.after):
            return self._ended(step, first, "the run ended before its batches: no pause")
        kill_process_tree(first.pid, signal.SIGSTOP)
        self._say(step, f"SIGSTOP after {len(first.batches())} batches (run {self.runs}); host {OTHER_HOST} starts")
        try:
            second = self._start(host=OTHER_HOST, environment=SHORT_LEASE)
            self._ended(step, second, f"on host {OTHER_HOST}, the paused run's lock taken over")
        finally:
            kill_process_tree(first.pid, signal.SIGCONT)  # the driver, its JVM and its workers, as they stopped
        code = first.wait(300)
        first.close()
        line = first.error_line() or ""
        if code != 0 and "lost its lease" not in line:
            raise NemesisFailure(f"{step.encode()}: the paused run, continued, exited {code}: {line}")
        self._say(step, f"the paused run, continued: exit {code}" + (f" ({line.removeprefix('error: ')[:100]})"
                                                                      if line else ""))  # fmt: skip

    def _s3_multipart(self, step: Step) -> None:
        table = self._delta_sink()
        assert self.daemons.s3 is not None and table is not None
        self._say(step, self.daemons.s3.abandon_next_commit(table))

    def _outage(
        self,
        step: Step,
        down: Callable[[], object],
        up: Callable[[], object],
        down_s: float = OUTAGE_S,
        outage: str = "",
    ) -> None:
        child = self._start()
        reached = self._after_batches(child, step.after)
        if reached:
            try:
                down()
                time.sleep(down_s)
            finally:
                up()  # a server left down would fail every later step, and every shorter sequence tried
        outage = outage or f"{step.action} stopped {down_s:.0f} s"
        self._ended(step, child, outage if reached else "no outage: run ended")

    def _executor(self, step: Step) -> None:
        self._machine_fault(step)

    def _datanode(self, step: Step) -> None:
        self._machine_fault(step)

    def _machine_fault(self, step: Step) -> None:
        """The crash harness's own run through a fault of the cluster's machines (each sink's write in turn), which
        the run survives and drains; a fault that left no evidence is said, not counted as a failure of the run."""
        self.runs += 1
        logs = self.workdir / "logs" / f"run-{self.runs}-{step.action}"
        result = run_with_crashes(
            self.cell_file,
            [MACHINE_FAULTS[step.action]],
            log_dir=logs,
            emit=lambda _: None,
            cluster=self.daemons.cluster,
        )
        missed = f"; no evidence: {'; '.join(result.missed)}" if result.missed else ""
        self._say(
            step, f"{len(result.crashes)} fault(s) met, {result.batches} batches, drained (run {self.runs}){missed}"
        )

    def _backup(self, step: Step) -> None:
        target = self.storage / "backups" / f"backup-{len(self.backups)}"
        self._cli(step, "checkpoint", "backup", str(self.cell_file), "--to", str(target))
        self.backups.append(target)
        self._say(step, f"backup {len(self.backups) - 1} at batch {committed_batches(self.spec.checkpoint_dir)[-1]}")

    def _restore(self, step: Step) -> None:
        which = step.index % len(self.backups)
        before = {folder.text for folder in kept_aside(self.checkpoint, "replaced")}
        self._cli(step, "checkpoint", "restore", str(self.cell_file), "--from", str(self.backups[which]))
        aside = kept_aside(self.checkpoint, "replaced")
        # This restore's copy is the name that was not there before it, not the last by name: a name of the same
        # second freed by a put-back is taken again (a CI run kept batch 9's copy for batch 2's).
        made = [folder for folder in aside if folder.text not in before]
        # The checkpoint an operator puts back is the one the pipeline last ran on. A restore right after another,
        # with no run between, replaced only the backup the first one restored (still among the backups): the first
        # one's is kept (found at step 169 of a 300-step run: two restores, then a put-back of the older backup).
        if self.replaced is None or self.replaced_at_run != self.runs:
            self.replaced, self.replaced_at_run = (made[-1] if made else None), self.runs
        for folder in aside:
            if self.replaced is None or folder.text != self.replaced.text:
                folder.delete(recursive=True)
        self._say(step, f"restored backup {which} (checkpoint at batch {committed_batches(self.checkpoint)[-1]})")

    def _lose_checkpoint(self, step: Step) -> None:
        self.checkpoint.delete(recursive=True)
        self._say(step, "checkpoint deleted")
        self._expect_refusal(step, "checkpoint-lost")

    def _lose_commits(self, step: Step) -> None:
        table = self._delta_sink()
        assert table is not None
        count = max(1, step.index)
        log = table / "_delta_log"
        gone: list[int] = []
        for version in range(latest_version(table), -1, -1):
            if len(gone) == count:
                break
            text = commit_file(table, version).read_text()
            if pipeline_commit(text, self.spec.name) is None:
                break  # only the pipeline's own trailing commits (a Delta checkpoint of one stays: the start says so)
            for name in (
                f"{version:020d}.json",
                f".{version:020d}.json.crc",
                f"{version:020d}.crc",
                f".{version:020d}.crc.crc",
            ):
                (log / name).delete()
            gone.append(version)
        self._say(step, f"{table}: commits {gone} gone")
        if gone:
            self._expect_refusal(step, "sink-behind", carry_on_allowed=True)

    def _table_restore(self, step: Step) -> None:
        table = self._delta_sink()
        assert table is not None
        said, restored = restore_behind(self.spark, table, self.spec.name, max(1, step.index))
        self._say(step, said)
        if restored:
            self._expect_refusal(step, "sink-behind", carry_on_allowed=True)

    def _delta_sink(self) -> Location | None:
        tables = [Location(str(sink.path)) for sink in self.spec.sink_specs if isinstance(sink, DeltaSinkSpec)]
        return tables[0] if tables else None
