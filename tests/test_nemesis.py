"""The nemesis: composed faults and operator actions on a live stream, then both checkers on every sink.

Without a JVM: a sequence is written and read back exactly (what a failing run prints to replay it), and a step it
cannot read is one line naming it; a paused nemesis's state gives back the same nemesis, once.

Integration (real Kafka, Spark, Delta, PostgreSQL; every kill a SIGKILL of the run's process tree): a small nemesis
of three steps drawn from a seed on a pipeline with a Delta table and a PostgreSQL table, the broker and PostgreSQL
restartable, paused after its first step, the servers restarted, then resumed.
Expected: every step carries on or refuses with the line the docs list for it (and is repaired), and at the end
every sink is 0 lost / 0 duplicated / 0 unexpected by both checkers. Then the old "first batch of a run only" replay
rule planted into the pipeline's processes (a ``sitecustomize`` on their path), on the same pipeline deduplicating
(so the batches the sinks hold beyond a restored backup run again): replaying a backup restored two batches behind
ends in duplicates, which the nemesis reports with the sequence to replay. (Both are in the slow tier, `make
test-all`: tests/conftest.py SLOW_TIER names the CI tests that prove the same.)
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from streamproof.checkpoint.copies import backup, kept_aside
from streamproof.checkpoint.log import committed_batches, rebuild
from streamproof.errors import ConfigError, InfraError
from streamproof.harness.daemons import Daemons, kafka_up_supervised
from streamproof.harness.nemesis import Nemesis
from streamproof.harness.resume import PauseOnSignal, resumed, save_paused
from streamproof.harness.search import replay, search, shorten
from streamproof.harness.sequence import Sequence, Step, parse_sequence, plan
from streamproof.infra import PG_PASSWORD_ENV, KafkaBroker, PostgresServer
from streamproof.infra.kafka import KafkaCluster, KafkaExitedWhileStarting
from streamproof.kafka_client import ensure_topic
from streamproof.sinks.base import TOO_OLD_REPAIR
from streamproof.storage.location import Location

# The old rule: a sink decides the first batch of a run from what it holds and writes every later one unchecked.
FIRST_BATCH_ONLY = '''
import streamproof.sinks.base as base

_decide = base.Sink.replay_check


def _first_batch_only(self, batch):
    first = getattr(self, "_planted_first", None)
    if first is None:
        self._planted_first = first = batch.batch_id
    if batch.keyed and batch.batch_id != first:
        return False
    return _decide(self, batch)


base.Sink.replay_check = _first_batch_only
'''


def test_a_sequence_is_written_and_read_back_exactly() -> None:
    sequence = Sequence(17, [Step("kill", 2, 0.41), Step("backup"), Step("term", 3), Step("restore", index=1),
                             Step("lose-checkpoint"), Step("lose-commits", index=2), Step("broker", 1)])  # fmt: skip
    text = sequence.encode()
    assert text == "data=17,kill@2:0.41,backup,term@3,restore:1,lose-checkpoint,lose-commits:2,broker@1"
    assert parse_sequence(text) == sequence
    with pytest.raises(ConfigError, match=r"--nemesis-replay: 'explode@2' is not a step; expected one of kill, "):
        parse_sequence("data=1,explode@2")


def test_the_same_seed_gives_the_same_sequence_and_each_step_applies_in_the_plan_s_model() -> None:
    """Without a JVM: a sequence is drawn from its seed before anything runs, so two plans of one seed are the same
    sequence (and other seeds other ones); in it no restore comes before a backup, and no backup, loss of the
    checkpoint or loss of commits before a step has run the pipeline; an action the set-up does not support (here:
    S3, a cluster) is never drawn."""
    local = {"drain", "term", "kill", "backup", "restore", "broker", "postgres", "lose-commits", "lose-checkpoint",
             "standby"}  # fmt: skip
    first, again = plan(3901, 300, local.__contains__), plan(3901, 300, local.__contains__)
    assert first.encode() == again.encode() and len(first.steps) == 300
    assert len({plan(seed, 30, local.__contains__).encode() for seed in range(20)}) == 20
    assert {step.action for step in first.steps} == local  # every supported action drawn in 300 steps, nothing else
    ran = backed_up = False
    for step in first.steps:
        assert step.action != "restore" or backed_up, first.encode()
        assert step.action not in ("backup", "lose-checkpoint", "lose-commits") or ran, first.encode()
        backed_up = backed_up or step.action == "backup"
        ran = ran or step.action in ("drain", "term", "kill", "broker", "postgres", "standby")
    assert parse_sequence(first.encode()) == first


def test_a_failing_sequence_is_shortened_by_removing_steps_within_its_bound() -> None:
    """Without a JVM: the failure needs a backup, a run, then a restore of it; every other step goes, in a few tries
    (halves first), an empty sequence is never tried, and the bound stops the shortening where it is."""
    failing = parse_sequence("data=9,kill@2:0.41,term@1,backup,broker@1,drain,kill@1:0.2,restore:0,standby@2,drain")
    tried: list[str] = []

    def still_fails(sequence: Sequence) -> bool:
        tried.append(sequence.encode())
        actions = [step.action for step in sequence.steps]
        if "backup" not in actions or "restore" not in actions:
            return False
        return "drain" in actions[actions.index("backup") : actions.index("restore")]

    assert shorten(failing, still_fails, lambda: False).encode() == "data=9,backup,drain,restore:0"
    assert "data=9" not in tried and len(tried) < 2 * len(failing.steps)
    tried.clear()
    assert shorten(failing, still_fails, lambda: len(tried) >= 1) == failing and len(tried) == 1


def test_a_paused_nemesis_is_resumed_as_it_was_and_only_once(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    """Without a JVM, on the test broker: the state a pause writes gives back the same nemesis (its topic, backups,
    counts, history) at the step it paused before; the resume takes the state, so a second resume is refused; so are
    a folder with no paused nemesis, another pipeline or the same one edited, other servers up than the nemesis ran
    with, and a broker that lost the nemesis's topic (servers on a fresh folder), each in one line."""
    pipeline_file = tmp_path / "pipeline.toml"
    pipeline_file.write_text(f"""
name = "paused"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{kafka_broker.bootstrap_servers}"
topic = "paused"
[transform]
schema = "event_id STRING, order_id STRING, amount DOUBLE, event_time TIMESTAMP"
required = ["event_id"]
[[sinks]]
label = "delta"
kind = "delta"
path = "{tmp_path}/orders"
""")
    folder = tmp_path / "nemesis" / "sequence-1"
    lines: list[str] = []
    before = Nemesis(pipeline_file, folder, None, Daemons(), 41, lines.append, label="s1")  # type: ignore[arg-type]
    before.backups, before.replaced = [Location(folder / "backups" / "backup-0")], Location(folder / "aside")
    before.runs, before.produced, before.steps_applied, before.history = 3, 2, 2, ["step 1 drain: ...", "step 2 ..."]
    before.replaced_at_run = 3
    sequence = parse_sequence("data=41,drain,backup,kill@1:0.5,restore:0")
    saved = save_paused(before, sequence, 2, [])

    def resume(pipeline: Path = pipeline_file, daemons: Daemons | None = None) -> tuple[Nemesis, Sequence, int]:
        return resumed(pipeline, folder, None, daemons or Daemons(), lines.append)  # type: ignore[arg-type]

    with pytest.raises(ConfigError, match=r"ran with these servers up: none; up now: Kafka: start the same ones"):
        resume(daemons=Daemons(kafka_broker))
    other = tmp_path / "other.toml"
    other.write_text(pipeline_file.read_text())
    with pytest.raises(ConfigError, match=r"is a nemesis of .*pipeline.toml, not of .*other.toml"):
        resume(other)
    text = pipeline_file.read_text()
    pipeline_file.write_text(text.replace('"paused"', '"edited"', 1))
    with pytest.raises(ConfigError, match=r"pipeline.toml changed since the nemesis in .* paused; put it back"):
        resume()
    pipeline_file.write_text(text)
    with pytest.raises(ConfigError, match=rf"topic {before.topic} is not on .*: its records are gone"):
        resume()
    assert saved.exists()  # a refused resume takes nothing
    ensure_topic(kafka_broker.bootstrap_servers, before.topic, partitions=4)
    after, again, start = resume()
    assert (again, start) == (sequence, 2)
    assert (after.topic, after.stamp, after.data_seed, after.label) == (before.topic, before.stamp, 41, "s1")
    assert [location.text for location in after.backups] == [location.text for location in before.backups]
    assert after.replaced is not None and after.replaced.text == str(folder / "aside") and after.replaced_at_run == 3
    assert (after.runs, after.produced, after.steps_applied, after.history) == (3, 2, 2, before.history)
    assert not saved.exists() and len(list(folder.glob("nemesis.json.resumed-*"))) == 1
    with pytest.raises(ConfigError, match=r"--nemesis-resume: .*sequence-1 holds no paused nemesis"):
        resume()


def test_two_restores_in_a_row_keep_the_checkpoint_the_pipeline_last_ran_on_for_the_put_back(tmp_path: Path) -> None:
    """Without a server (a local checkpoint; the CLI's `checkpoint restore` in a child, as the nemesis calls it): a
    restore right after another, no run between, replaced only the backup the first restored; the checkpoint kept
    for the put-back is the one the pipeline last ran on, and a too-old refusal puts that one back. After a run, a
    restore keeps its own. Found at step 169 of a 300-step run: two restores, then the older backup put back, which
    was refused again."""
    nemesis = _nemesis_without_servers(tmp_path, "restored", sink="delta")
    checkpoint = nemesis.checkpoint
    for through, name in ((2, "backup-0"), (4, "backup-1")):
        rebuild(checkpoint, {batch: {"restored": {"0": 10 * batch}} for batch in range(through + 1)}, through)
        nemesis.backups.append(backup(checkpoint, Location(tmp_path / "backups" / name)))
        checkpoint.delete(recursive=True)
    rebuild(checkpoint, {batch: {"restored": {"0": 10 * batch}} for batch in range(10)}, 9)  # where it ran to
    nemesis.runs = 5
    nemesis._restore(Step("restore", index=0))
    nemesis._restore(Step("restore", index=1))
    assert committed_batches(checkpoint)[-1] == 4  # backup 1 restored last
    assert nemesis.replaced is not None and committed_batches(nemesis.replaced)[-1] == 9
    assert kept_aside(checkpoint, "replaced") == [nemesis.replaced]  # backup 0's copy, replaced by the second, gone
    refused = f"error: .../files holds batch 3 ... cannot be checked: {TOO_OLD_REPAIR}"
    assert nemesis._put_back_if_too_old(Step("drain"), 2, refused)
    assert committed_batches(checkpoint)[-1] == 9 and nemesis.replaced is None
    # A copy whose name sorts after the next restore's own: the put-back's copy in a second whose first name was
    # freed (a CI run kept batch 9's copy for batch 2's), here planted under a later stamp so it happens every time.
    rebuild(checkpoint.with_name(f"{checkpoint.name}.replaced-29991231T235959"), {0: {"restored": {"0": 0}}}, 0)

    nemesis._restore(Step("restore", index=0))
    nemesis.runs += 1  # a run on the restored backup: the pipeline ran on it since
    nemesis._restore(Step("restore", index=1))
    assert nemesis.replaced is not None and committed_batches(nemesis.replaced)[-1] == 2
    assert kept_aside(checkpoint, "replaced") == [nemesis.replaced]


def _nemesis_without_servers(tmp_path: Path, name: str, *, sink: str) -> Nemesis:
    """A nemesis over a pipeline whose checkpoint is local and whose servers are never reached (the steps it runs here
    are driven by hand): its topic is its name, its one sink of ``sink``'s kind under ``tmp_path``."""
    pipeline_file = tmp_path / "pipeline.toml"
    pipeline_file.write_text(f"""
name = "{name}"
checkpoint = "{tmp_path}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "127.0.0.1:9"
topic = "{name}"
[transform]
schema = "event_id STRING"
[[sinks]]
label = "{sink}"
kind = "{sink}"
path = "{tmp_path}/{sink}"
""")
    return Nemesis(pipeline_file, tmp_path / "n", None, Daemons(), 7, lambda line: None)  # type: ignore[arg-type]


class _Run:
    """A pipeline run as the nemesis's judgement sees it, without a process: its batches, exit code and error line."""

    def __init__(self, code: int, batches: int = 0, line: str | None = None, *, running_for_polls: int = 0) -> None:
        self.code, self.line, self.killed, self.running_for_polls = code, line, False, running_for_polls
        self._batches = [(batch, None) for batch in range(batches)]
        self.process = self

    def poll(self) -> int | None:
        self.running_for_polls -= 1
        return None if self.running_for_polls >= 0 else self.code

    def batches(self) -> list[Any]:
        return self._batches

    def wait(self, timeout_s: float = 0) -> int:
        return self.code

    def error_line(self) -> str | None:
        return self.line

    def notices(self, kind: str) -> list[str]:
        return []

    def wait_for(self, *args: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def kill_tree(self) -> None:
        self.killed = True


@pytest.mark.parametrize("holder_batches", [0, 1], ids=["before-its-first-batch", "after-it-before-the-kill"])
def test_a_holder_refused_for_a_restore_too_far_back_is_repaired_once_though_the_standby_meets_the_same_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holder_batches: int
) -> None:
    """Without a server: a standby step right after a restore too far back. The run meant to hold the lock is refused
    (documented: the checkpoint the restore replaced is put back), before its first batch or after it; a standby
    started beside it takes over the same state and meets the same refusal. The put-back is made once, a drain then
    runs, and the step is not failed. Found at step 175 of the five-sink 300-step run: the standby's refusal was judged
    after the put-back, found nothing left to put back, and failed the nemesis."""
    nemesis = _nemesis_without_servers(tmp_path, "standby-refused", sink="files")
    replaced = Location(tmp_path / "checkpoint.replaced")
    (replaced / "commits").mkdir()
    nemesis.replaced = replaced
    refused = f"error: pipeline 'standby-refused' failed: .../files holds batch 3 ... checked: {TOO_OLD_REPAIR}"
    holder = _Run(2, holder_batches, refused, running_for_polls=holder_batches)  # ends after its batches, if any
    runs = [holder, _Run(0, 5)]  # the holder, then the drain after the put-back
    standbys: list[_Run] = []
    repairs: list[tuple[str, ...]] = []
    monkeypatch.setattr(nemesis, "_start", lambda available_now=True: runs.pop(0))
    monkeypatch.setattr(nemesis, "_cli", lambda step, *args: repairs.append(args))

    def standby(*args: Any, **kwargs: Any) -> _Run:  # the standby takes over the holder's state: the same refusal
        standbys.append(_Run(2, 0, refused))
        return standbys[-1]

    monkeypatch.setattr("streamproof.harness.nemesis.steps.PipelineChild", standby)
    nemesis._standby(Step("standby", after=2))
    assert [args[:2] for args in repairs] == [("checkpoint", "restore")], repairs
    assert runs == [] and nemesis.replaced is None
    assert len(standbys) == holder_batches  # refused before its first batch: no standby is started beside it


def test_the_first_signal_asks_for_a_pause_the_second_aborts_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGINT again: the nemesis aborted"), PauseOnSignal() as pause:
        assert not pause.requested()
        signal.raise_signal(signal.SIGTERM)
        assert pause.requested()
        signal.raise_signal(signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def _pipeline(workdir: Path, broker: KafkaBroker, postgres: PostgresServer, dedup: bool = False) -> Path:
    """Delta and PostgreSQL sinks; or, deduplicating, the Delta sink alone (a per-partition sink such as PostgreSQL
    takes one Kafka split per task, which dedup's shuffle does not keep)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"pipeline{'-dedup' if dedup else ''}.toml"
    state = 'dedup = { columns = ["event_id"], watermark = "event_time", delay = "1 hour" }' if dedup else ""
    pg = "" if dedup else f"""
[[sinks]]
label = "pg"
kind = "postgres"
port = {postgres.port}
password = "${{{PG_PASSWORD_ENV}}}"
table = "nemesis_orders"
"""
    path.write_text(f"""
name = "nemesis"
checkpoint = "{workdir}/checkpoint"
[source]
kind = "kafka"
bootstrap_servers = "{broker.bootstrap_servers}"
topic = "nemesis"
[transform]
schema = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
required = ["event_id", "order_id", "customer_id"]
quarantine = "{workdir}/quarantine"
{state}
[[sinks]]
label = "delta"
kind = "delta"
path = "{workdir}/orders"
{pg}
[retry]
backoff = "1 second"
""")
    return path


def test_a_kafka_node_that_exits_while_starting_is_started_again_as_a_supervisor_would() -> None:
    """A 300-step cluster nemesis (seed 4400) failed at step 7 on its own restart of a node, not on the pipeline: the
    node, SIGKILLed and started 3 s later, could not register while the controller quorum elected every 5 s, and
    exited after Kafka's 60 s (initial.broker.registration.timeout.ms), by design. Started again, it joined in 3 s.
    The nemesis now starts such a node again, three starts in all, and says so; any other failure is not retried."""

    class Node:
        def __init__(self, exits: int) -> None:
            self.exits, self.starts = exits, 0

        def up(self) -> str:
            self.starts += 1
            if self.starts <= self.exits:
                raise KafkaExitedWhileStarting("Kafka exited with code 1 while starting; last lines:\n...")
            return "started"

    exited_twice = Node(exits=2)
    said = kafka_up_supervised(exited_twice)  # type: ignore[arg-type]
    assert exited_twice.starts == 3
    assert said.count("Kafka exited with code 1 while starting") == 2 and said.endswith("as a supervisor would")
    assert kafka_up_supervised(Node(exits=0)) == ""  # type: ignore[arg-type]
    with pytest.raises(KafkaExitedWhileStarting):
        kafka_up_supervised(Node(exits=3))  # type: ignore[arg-type]

    class Misconfigured(Node):
        def up(self) -> str:
            self.starts += 1
            raise InfraError("port 9092 on 127.0.0.1 is taken by another process")

    misconfigured = Misconfigured(exits=0)
    with pytest.raises(InfraError, match="taken"):
        kafka_up_supervised(misconfigured)  # type: ignore[arg-type]
    assert misconfigured.starts == 1


def test_a_cluster_started_again_waits_on_a_node_left_running_instead_of_starting_it_on_its_taken_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """After a stop of the whole cluster, node 1 exits while starting; node 2, started in the same ``up()``, runs but
    does not answer yet. The supervisor's second ``up()`` must wait on node 2, not start it again: a second start
    fails on its own port, and the step with it. Only node 1, no longer running, is started again."""
    running = {1: False, 2: True, 3: False}  # what the first up() left behind
    answering: set[int] = set()
    starts: list[int] = []

    class Started:
        returncode = None

        def poll(self) -> None:
            return None

    def start(member: KafkaBroker) -> Started:
        if running[member.node_id]:
            raise InfraError(f"port {member.port} on 127.0.0.1 is taken by another process")
        starts.append(member.node_id)
        running[member.node_id] = True
        return Started()

    def answers(member: KafkaBroker, timeout_s: float = 5.0) -> bool:
        checked = member.node_id in answering
        answering.add(member.node_id)  # each node answers from the second look on
        return checked

    monkeypatch.setattr(KafkaBroker, "running", lambda member: running[member.node_id])
    monkeypatch.setattr(KafkaBroker, "_answers", answers)
    monkeypatch.setattr(KafkaBroker, "start", start)
    monkeypatch.setattr("streamproof.infra.kafka.port_in_use", lambda port: True)
    monkeypatch.setattr(KafkaCluster, "broker_ids", lambda cluster: sorted(answering))
    cluster = KafkaCluster(tmp_path, ports=[(19092, 19093), (19094, 19095), (19096, 19097)])
    said = cluster.up(timeout_s=10)
    assert starts == [1, 3], "node 2 ran already: it is waited on, not started again"
    assert said.startswith("started a Kafka cluster")
    running[2] = False  # a node waited on that exits is a start that failed, for the supervisor to start again
    with pytest.raises(KafkaExitedWhileStarting, match="Kafka exited while starting"):
        cluster.members[1].wait_answering(None, deadline=time.monotonic() + 10)
    # One that runs and never answers was not started by this call: it is named, and left to the operator.
    running[2] = True
    stopped: list[object] = []
    monkeypatch.setattr(KafkaBroker, "_answers", lambda member, timeout_s=5.0: False)
    monkeypatch.setattr("streamproof.infra.common.DaemonProcess.stop", lambda process: stopped.append(process))
    with pytest.raises(InfraError, match="runs but did not answer .* `streamproof infra down` stops it"):
        cluster.members[1].wait_answering(None, deadline=time.monotonic() + 1)
    assert stopped == []


@pytest.mark.integration
@pytest.mark.crash
def test_a_small_nemesis_drawn_from_a_seed_pauses_resumes_and_ends_clean(
    kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, spark: Any, tmp_path: Path
) -> None:
    """Three steps from seed 11, paused after the first (as a SIGTERM asks), every server stopped and started again
    (as between two sessions), then resumed by a new nemesis from the state the pause wrote: it carries on from step
    2, and the end is clean by both checkers."""
    pipeline_file = _pipeline(tmp_path, kafka_broker, streamproof_postgres)
    daemons = Daemons(kafka_broker, streamproof_postgres)
    lines: list[str] = []
    first_part = search(pipeline_file, steps=3, seed=11, spark=spark, workdir=tmp_path / "search", daemons=daemons,
                        emit=lines.append, shrink_minutes=0,
                        pause_requested=lambda: any(line.startswith("step 1 ") for line in lines))  # fmt: skip
    assert first_part.ok and first_part.paused is not None, (first_part.failure, lines)
    sequence = parse_sequence(first_part.sequence)
    assert f"the sequence of seed 11: {first_part.sequence}" in lines  # printed before its first step, as run
    assert lines[-1] == f"nemesis: paused before step 2 of 3; its state is in {first_part.paused}"
    for server in (kafka_broker, streamproof_postgres):
        server.down()
        server.up()

    nemesis, resumed_sequence, start = resumed(pipeline_file, first_part.paused.parent, spark, daemons, lines.append)
    assert (resumed_sequence, start, nemesis.steps_applied) == (sequence, 1, 1)
    outcome = replay(pipeline_file, resumed_sequence, spark=spark, workdir=first_part.paused.parent, daemons=daemons,
                     emit=lines.append, nemesis=nemesis, start=start)  # fmt: skip
    print("\n".join(lines))
    assert outcome.ok, (outcome.failure, outcome.sequence)
    steps_run = [line.split(" ")[1] for line in outcome.history if line.startswith("step ")]
    assert sorted(set(steps_run), key=int) == ["1", "2", "3", "4"]  # three steps, then the drain, each once
    assert lines[-1].startswith("end: ") and "every sink 0/0/0, both checkers agree" in lines[-1]


@pytest.mark.integration
@pytest.mark.crash
def test_a_replay_bug_planted_in_the_pipeline_is_found_by_replaying_its_sequence(
    kafka_broker: KafkaBroker, streamproof_postgres: PostgresServer, spark: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    daemons = Daemons(kafka_broker, streamproof_postgres)
    lines: list[str] = []
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "sitecustomize.py").write_text(FIRST_BATCH_ONLY)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    # A deduplicating pipeline: its held batches run again (its state must see them), so the rule decides each.
    stateful_file = _pipeline(tmp_path / "stateful", kafka_broker, streamproof_postgres, dedup=True)
    found = replay(stateful_file, parse_sequence("data=5,term@2,backup,drain,restore:0"), spark=spark,
                   workdir=tmp_path / "replay", daemons=daemons, emit=lines.append)  # fmt: skip
    print("\n".join(lines))
    assert not found.ok and "delta: lost 0, duplicated " in str(found.failure), found.failure
    assert found.sequence == "data=5,term@2,backup,drain,restore:0"
