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
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from streamproof.errors import InfraError
from streamproof.faults.points import process_cmdline, process_info

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


_HANDED_OUT: set[int] = set()  # two servers asking before either binds its port get two ports


def restartable_port() -> int:
    """A TCP port free on 127.0.0.1 right now, below the ephemeral range (32768 on), not handed out before by this
    process: a server SIGKILLed and started again on it (a nemesis) finds it free, where an ephemeral one may
    meanwhile be any client's local port."""
    draw = random.Random()
    for _ in range(200):
        port = draw.randint(20_000, 32_000)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    raise InfraError("no free TCP port between 20000 and 32000 on 127.0.0.1")


def port_in_use(port: int) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def process_alive(pid: int) -> bool:
    """True if ``pid`` runs; an exited process waiting to be reaped (zombie) counts as stopped."""
    info = process_info(pid)
    return info is not None and info.alive


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


@dataclass(frozen=True)
class DaemonProcess:
    """One process a daemon's ``up`` started: its pid file, and a text its command line must hold to be ours, so
    that a recycled pid is never signalled.

    >>> DaemonProcess(Path("/nonexistent/broker.pid"), "server.properties").pid() is None
    True
    """

    pid_file: Path
    marker: str

    def pid(self) -> int | None:
        """The pid, while that process runs and is ours."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self.marker in process_cmdline(pid) and process_alive(pid) else None

    def start(self, command: list[str], *, output: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``command`` in a session of its own (it survives the CLI; Ctrl-C does not reach it), its output
        appended to ``output``; record its pid."""
        if self.marker not in " ".join(command):
            raise InfraError(f"internal: {self.marker!r} is not in the command that starts {self.pid_file.stem}")
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        self.pid_file.write_text(str(process.pid))
        return process

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL past ``timeout_s``; returns the pid stopped (None when it was not running)."""
        pid = self._signal_and_wait(signal.SIGTERM, timeout_s, poll_s=0.2)
        if pid is not None and process_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if pid is not None:
            reap(pid)
        self.pid_file.unlink(missing_ok=True)
        return pid

    def kill(self) -> int | None:
        """SIGKILL now (a fault the crash harness injects); returns the pid killed."""
        pid = self._signal_and_wait(signal.SIGKILL, STOP_TIMEOUT_S, poll_s=0.05)
        if pid is not None:
            reap(pid)
        return pid

    def _signal_and_wait(self, signal_number: int, timeout_s: float, poll_s: float) -> int | None:
        """Send ``signal_number`` to the daemon, if running, and wait up to ``timeout_s`` for it to end."""
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal_number)
            deadline = time.monotonic() + timeout_s
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(poll_s)
        return pid


def wait_until(
    condition: Callable[[], bool],
    timeout_s: float,
    *,
    interval_s: float = 0.3,
    exited: subprocess.Popen[bytes] | None = None,
) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False); stops early (False) when the
    process ``exited`` is given and has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        if exited is not None and exited.poll() is not None:
            return False
        time.sleep(interval_s)
    return False


def wiped(home: Path, message: str, wipe: bool) -> str:
    """``message``, with ``home`` deleted first when ``wipe`` (what ``infra down --wipe`` adds to every service).

    Example::

        >>> wiped(Path("/nonexistent/streamproof"), "stopped HDFS", wipe=True)
        'stopped HDFS'
    """
    if wipe and home.exists():
        shutil.rmtree(home)
        message += f"; deleted {home}"
    return message
