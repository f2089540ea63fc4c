"""A nemesis sequence (:mod:`streamproof.harness.nemesis`): its steps, its text form, and the plan one seed gives.

A sequence is written as its steps joined by ``,`` after the seed of its data, e.g.
``data=7,kill@2:0.41,backup,drain,restore:0,drain``: :func:`parse_sequence` reads it back, so a failing sequence is
replayed exactly (``--nemesis-replay``). :func:`plan` draws a whole sequence from a seed before anything runs: each
step's action among those that apply in the plan's own model of the pipeline's state (a checkpoint with batches
once a step has run the pipeline, a backup before a restore), never in the live state, whose timing varies from run
to run (a kill may land before or after a batch's commit). One seed, one sequence.

Example::

    >>> plan(3, 4, supports=lambda action: action in ("drain", "kill", "backup", "restore")).encode()
    'data=511025151,drain,kill@3:0.47,backup,drain'
    >>> parse_sequence("data=7,kill@2:0.41,restore:0").steps
    [Step(action='kill', after=2, phase=0.41, index=0), Step(action='restore', after=1, phase=0.0, index=0)]
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from streamproof.errors import ConfigError

# Done during a run, after some batches: a server away for a few seconds (on a Kafka cluster, one of its nodes), or
# another writer's maintenance of the sink tables.
OUTAGES = ("broker", "postgres", "s3", "s3-slow", "s3-reset", "s3-lost-answer", "s3-conflict", "leader", "controller",
           "pause", "optimize")  # fmt: skip
# A run and another "host" (UTS and PID namespaces of its own) on the same checkpoint, the run lock a lease.
HOST_STEPS = ("moved", "other-host", "driver-pause")
ACTIONS = (
    "kill",
    "term",
    "drain",
    "standby",
    *OUTAGES,
    "backup",
    "restore",
    "lose-checkpoint",
    "lose-commits",
    "s3-multipart",
    "executor",
    "datanode",
    "table-restore",
    *HOST_STEPS,
)
RUNS = ("kill", "term", "drain", "standby", *OUTAGES, "executor", "datanode", *HOST_STEPS)  # they run the pipeline
# The actions a step draws from, simplest first: a failing sequence shrinks towards the front.
ORDER = (
    "drain",
    "term",
    "kill",
    "backup",
    "restore",
    "broker",
    "postgres",
    "s3-slow",
    "s3-reset",
    "s3-lost-answer",
    "s3-conflict",
    "s3",
    "lose-commits",
    "lose-checkpoint",
    "s3-multipart",
    "standby",
    "executor",
    "datanode",
    "leader",
    "controller",
    "pause",
    "optimize",
    "table-restore",
    *HOST_STEPS,
)
_STEP = re.compile(r"(?P<action>[a-z][a-z0-9-]*)(?:@(?P<after>\d+)(?::(?P<phase>[\d.]+))?)?(?::(?P<index>\d+))?")


@dataclass(frozen=True)
class Step:
    """One action of the nemesis (its module's table), with its parameters.

    >>> Step("kill", after=2, phase=0.41).encode(), Step("lose-commits", index=2).encode()
    ('kill@2:0.41', 'lose-commits:2')
    """

    action: str
    after: int = 1  # batches of the run before the fault (run steps)
    phase: float = 0.0  # kill: the fraction of a batch's duration waited after them
    index: int = 0  # restore: which backup; lose-commits: how many commits

    def encode(self) -> str:
        if self.action == "kill":
            return f"kill@{self.after}:{self.phase:.2f}"
        if self.action in ("term", "standby", *OUTAGES, *HOST_STEPS):
            return f"{self.action}@{self.after}"
        if self.action in ("restore", "lose-commits", "table-restore"):
            return f"{self.action}:{self.index}"
        return self.action


@dataclass(frozen=True)
class Sequence:
    """The seed of the data and the steps: what replays a nemesis run."""

    data_seed: int
    steps: list[Step]

    def encode(self) -> str:
        return ",".join([f"data={self.data_seed}", *(step.encode() for step in self.steps)])


def parse_sequence(text: str) -> Sequence:
    """A sequence as :meth:`Sequence.encode` writes it; one clear line for a step it cannot read.

    >>> parse_sequence("data=3,term@2,lose-checkpoint,s3-slow@1").encode()
    'data=3,term@2,lose-checkpoint,s3-slow@1'
    """
    parts = [part.strip() for part in text.split(",") if part.strip()]
    seed = 1
    if parts and parts[0].startswith("data="):
        seed = int(parts.pop(0)[5:])
    steps = []
    for part in parts:
        match = _STEP.fullmatch(part)
        if match is None or match["action"] not in ACTIONS:
            raise ConfigError(
                f"--nemesis-replay: {part!r} is not a step; expected one of {', '.join(ACTIONS)} "
                "(e.g. kill@2:0.41, term@1, restore:0, lose-commits:1)"
            )
        steps.append(
            Step(match["action"], int(match["after"] or 1), float(match["phase"] or 0.0), int(match["index"] or 0))
        )
    return Sequence(seed, steps)


def state_allows(action: str, *, has_batches: bool, backups: int) -> bool:
    """What ``action`` needs of the pipeline's state: a checkpoint with batches (a backup, a loss of the checkpoint or
    of a sink's commits), a backup (a restore). The nemesis asks it of the live state before each step, :func:`plan`
    of its model.

    >>> state_allows("restore", has_batches=True, backups=0), state_allows("drain", has_batches=False, backups=0)
    (False, True)
    """
    needs = {
        "backup": has_batches,
        "lose-checkpoint": has_batches,
        "lose-commits": has_batches,
        "restore": backups > 0,
        "table-restore": has_batches,
    }
    return needs.get(action, True)


def plan(seed: int, steps: int, supports: Callable[[str], bool]) -> Sequence:
    """The sequence of ``steps`` steps that ``seed`` gives: its data seed, then each step's action drawn among those
    the set-up ``supports`` (its servers, sinks, cluster) and the plan's model of the state allows
    (:func:`state_allows`), and its parameters. Drawn before anything runs, so the same seed gives the same
    sequence whatever happens when it runs (a step the live state does not allow then is skipped, and says so).

    >>> plan(7, 3, supports=lambda action: True) == plan(7, 3, supports=lambda action: True)
    True
    """
    draw = random.Random(seed)
    data_seed = draw.randrange(1, 2**31 - 1)
    has_batches, backups, planned = False, 0, []
    for _ in range(steps):
        choices = [
            action
            for action in ORDER
            if supports(action) and state_allows(action, has_batches=has_batches, backups=backups)
        ]
        action = draw.choice(choices)
        if action == "kill":
            step = Step("kill", draw.randint(1, 3), round(draw.random(), 2))
        elif action == "term":
            step = Step("term", draw.randint(1, 3))
        elif action in ("standby", *OUTAGES, *HOST_STEPS):
            step = Step(action, draw.randint(1, 2))
        elif action == "restore":
            step = Step("restore", index=draw.randint(0, 7))
        elif action in ("lose-commits", "table-restore"):
            step = Step(action, index=draw.randint(1, 2))
        else:
            step = Step(action)
        planned.append(step)
        has_batches = has_batches or action in RUNS
        backups += action == "backup"
    return Sequence(data_seed, planned)
