"""What the local daemons share (Kafka, PostgreSQL): a state folder, loopback ports, and processes that are
stopped by the pid they were started with, only if that pid still runs the daemon started (a recycled pid is
never killed).

Example::

    >>> port = free_port()
    >>> port_in_use(port)
    False
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def default_state_dir() -> Path:
    """``STREAMPROOF_STATE`` or ``./.streamproof``."""
    return Path(os.environ.get("STREAMPROOF_STATE", ".streamproof")).resolve()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for tests that must not collide with a user's broker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_in_use(port: int) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def process_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_alive(pid: int) -> bool:
    """True if ``pid`` runs; an exited process waiting to be reaped (zombie) counts as stopped."""
    try:
        return not Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


@dataclass
class LocalDaemon:
    """What every local daemon has: a folder of its own under the state folder, and a log in it (an error that
    stops a start shows its last lines)."""

    state_dir: Path
    folder: ClassVar[str]
    log_name: ClassVar[str]

    @property
    def home(self) -> Path:
        return self.state_dir / self.folder

    @property
    def log_file(self) -> Path:
        return self.home / self.log_name
