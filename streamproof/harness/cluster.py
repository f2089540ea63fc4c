"""Faults of the machines under a pipeline on a cluster, and the evidence that they happened.

The faults are met inside the write's tasks (:mod:`streamproof.faults.in_tasks`): an executor JVM or a Worker SIGKILLed
from its own task halfway through the write, the first attempt of a task held until Spark speculates a copy of it.
The harness does what a task cannot: it SIGKILLs the DataNode while a held task waits (and starts it again), and
starts again a Worker a fault killed, once the faulted batch is committed.

Evidence comes from what Spark itself recorded: its event log (``spark.eventLog.dir``, set for every cluster run)
lists each task attempt of the sink's write job group, its executor, whether it was speculative and how it ended.
A fault whose evidence is missing (no attempt lost with its executor, no speculative attempt, no attempt failed
against the dead DataNode) fails the proof: a fault that never fired proves nothing.

Example::

    >>> faults = ClusterFaults(SparkCluster(Path(".streamproof")), HdfsCluster(Path(".streamproof")))  # doctest: +SKIP
    >>> faults.restart_datanode_under(Path("logs/faults"), "datanode-restart@3")                        # doctest: +SKIP
    {'killed_datanode_pid': 48211, 'restarted_datanode_pid': 48390, 'datanode_down_s': 1.0, ...}
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamproof.errors import ConfigError, PipelineError
from streamproof.faults.in_tasks import HARNESS_WAIT_S, RELEASED
from streamproof.faults.points import DATANODE_RESTART, EXECUTOR_MID_WRITE, SPECULATION, WORKER_LOSS
from streamproof.infra import HdfsCluster, SparkCluster
from streamproof.infra.common import wait_until

DATANODE_DOWN_S = 1.0  # the held task writes into the dead DataNode for this long before it is started again
# Speculation tuned for a short write: a copy of a task still running after 1 s, once half of its stage is done.
SPECULATION_CONF = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "1s",
    "spark.speculation.efficiency.enabled": "false",
    "spark.speculation.task.duration.threshold": "1s",
}


def event_log_conf(folder: Path) -> dict[str, str]:
    """Spark's event log into ``folder``: the evidence of task attempts on a cluster."""
    folder.mkdir(parents=True, exist_ok=True)
    # One plain JSON-lines file per application (Spark 4 rolls and compresses them by default).
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": folder.as_uri(),
        "spark.eventLog.rolling.enabled": "false",
        "spark.eventLog.compress": "false",
    }


@dataclass
class ClusterFaults:
    """Breaks and mends the daemons of a local cluster (:mod:`streamproof.infra`): the DataNode, Workers."""

    spark: SparkCluster | None
    hdfs: HdfsCluster | None

    def restart_datanode_under(self, fault_dir: Path, marker: str) -> dict[str, Any]:
        """When a task holds at ``marker`` (its write half done): SIGKILL the DataNode, let the task write on into
        it, start it again after :data:`DATANODE_DOWN_S`; what was done, as facts of the fault."""
        if self.hdfs is None:
            raise ConfigError("datanode-restart needs the HDFS of `streamproof infra up --hdfs` (same --state-dir)")
        if not wait_until((fault_dir / marker).exists, HARNESS_WAIT_S - 10):
            return {"held_task": False}  # the write never reached its fault (e.g. the sink wrote no rows)
        killed = self.hdfs.datanode.kill()
        down_from = time.monotonic()
        (fault_dir / (marker + RELEASED)).touch()
        time.sleep(DATANODE_DOWN_S)
        started = self.hdfs.start_datanode()
        live = wait_until(lambda: self.hdfs is not None and self.hdfs.live_datanodes() >= 1, 60)
        return {
            "held_task": True,
            "killed_datanode_pid": killed,
            "restarted_datanode_pid": started,
            "datanode_down_s": round(time.monotonic() - down_from, 1),
            "datanode_live_again": live,
        }

    def restore(self) -> dict[str, Any]:
        """Start again each Worker a fault killed; what was done."""
        if self.spark is None:
            return {}
        restarted = {
            number: self.spark.start_worker(number)
            for number in range(1, self.spark.workers + 1)
            if self.spark.worker(number).pid() is None
        }
        if not restarted:
            return {}
        if not wait_until(lambda: self.spark is not None and self.spark.alive_workers() >= self.spark.workers, 120):
            raise PipelineError(f"restarted worker(s) {sorted(restarted)} did not register with the master")
        return {"restarted_workers": restarted}


def cluster_faults(state_dir: Path) -> ClusterFaults | None:
    """The daemons `infra up` started under ``state_dir`` that a fault may break, or None when neither runs."""
    spark = SparkCluster.started_under(state_dir)
    hdfs = HdfsCluster(state_dir)
    running = (spark if spark.running() else None), (hdfs if hdfs.running() else None)
    return ClusterFaults(*running) if any(running) else None


def write_attempts(event_logs: Path, batch_id: int, sink: str | None = None) -> dict[str, Any]:
    """What Spark's event logs in ``event_logs`` say of the task attempts of batch ``batch_id``'s sink writes (of
    ``sink``, or of every sink): attempts, retried ones (attempt > 0), speculative ones, and how each ended.

    >>> write_attempts(Path("/nonexistent"), 1)["attempts"]
    0
    """
    prefix = f"streamproof-{batch_id}-"  # the job groups of the batch's sink writes: streamproof-<batch>-<sink>
    stages: set[int] = set()
    ends: Counter[str] = Counter()
    attempts = retried = speculative = 0
    logs = (
        sorted(log for log in event_logs.rglob("*") if log.is_file() and not log.name.startswith("."))
        if event_logs.is_dir()
        else []
    )
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # the last line of a log whose writer was killed
            kind = event.get("Event")
            if kind == "SparkListenerJobStart":
                group = (event.get("Properties") or {}).get("spark.jobGroup.id", "")
                if (group == prefix + sink) if sink else group.startswith(prefix):
                    stages.update(int(stage) for stage in event.get("Stage IDs", []))
            elif kind == "SparkListenerTaskEnd" and int(event.get("Stage ID", -1)) in stages:
                info = event.get("Task Info") or {}
                attempts += 1
                retried += int(info.get("Attempt", 0)) > 0
                speculative += bool(info.get("Speculative"))
                ends[str((event.get("Task End Reason") or {}).get("Reason", "?"))] += 1
    failed = sum(count for end, count in ends.items() if end not in ("Success", "TaskKilled"))
    return {"attempts": attempts, "retried": retried, "speculative": speculative, "failed": failed, "ends": dict(ends)}


def fault_happened(point: str, evidence: dict[str, Any]) -> str | None:
    """Why the evidence does not show ``point`` happening (one line), or None when it does.

    >>> fault_happened("speculation", {"attempts": 4, "speculative": 1, "ends": {"Success": 4}})
    >>> fault_happened("executor-mid-write", {"attempts": 5, "ends": {"Success": 4, "TaskKilled": 1}})
    'executor-mid-write: no attempt of a write task was lost with its executor'
    """
    ends = evidence.get("ends", {})
    if point in (EXECUTOR_MID_WRITE, WORKER_LOSS) and not ends.get("ExecutorLostFailure"):
        return f"{point}: no attempt of a write task was lost with its executor"
    if point == WORKER_LOSS and not evidence.get("restarted_workers"):
        return f"{point}: no Worker was lost"
    if point == SPECULATION and not evidence.get("speculative"):
        return f"{point}: Spark launched no speculative attempt of a write task"
    if point == DATANODE_RESTART:
        if not evidence.get("held_task"):
            return f"{point}: no write task reached its fault (did the sink write rows to HDFS?)"
        if not evidence.get("failed"):
            return f"{point}: no attempt of the write failed against the dead DataNode"
        if not evidence.get("datanode_live_again"):
            return f"{point}: the DataNode did not come back"
    return None
