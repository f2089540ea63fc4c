"""One pipeline run as a child process, the one harness streamproof starts pipelines through (the crash harness,
the benchmarks, the pytest plugin).

A child is ``python -m streamproof run PIPELINE`` started in a session of its own (``setsid``), so that it leads
a process group holding the Python driver and its Spark JVM. Its events (:mod:`streamproof.pipeline.events`)
come as JSON lines through a pipe of their own, each recorded with its arrival time. Its stdout (lines for
people) is copied to a file, its stderr (logs) goes to another. The child is over when both its event pipe and
its stdout are closed: the JVM inherits the driver's stdout (not the event pipe), so that is when the driver
and its JVM are both gone. A kill is a SIGKILL of the whole process tree
(:func:`streamproof.faults.points.kill_process_tree`); :meth:`close` also removes the run's Spark scratch folder, which
a killed JVM cannot delete itself, and which holds its JVM's temporary files too (:func:`jvm_temporary_files_in`).

Example::

    >>> child = PipelineChild(Path("orders.toml"), Path("logs"))                  # doctest: +SKIP
    >>> child.wait_for(lambda: len(child.batches()) >= 2, 300, "two batches")    # doctest: +SKIP
    >>> child.kill_tree(); child.close()                                          # doctest: +SKIP
"""

from __future__ import annotations

import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from streamproof.errors import PipelineError
from streamproof.faults.in_tasks import FAULT_DIR_ENV
from streamproof.faults.points import CRASH_ENV, ArmedCrash, kill_process_tree
from streamproof.jvm.session import JIT_ENV, UI_ENV
from streamproof.pipeline.events import EVENTS_FD_ENV, BatchCommitted, Event, Notice, decode

RUN_TIMEOUT_S = 900.0


def import_path() -> str:
    """``PYTHONPATH`` for a child run: the folders this process imports from that the environment does not give a
    new interpreter (a test's folder pytest added, a pipeline file's folder), after ``$PYTHONPATH``'s own, so that
    the child imports your transform and sink as this process does.

    >>> import_path().split(os.pathsep)[-1] != ""
    True
    """
    installed = {os.path.realpath(prefix) for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}}
    given = [os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    added = [
        os.path.abspath(entry or ".")
        for entry in sys.path
        if os.path.isdir(entry or ".")
        and not any(os.path.realpath(entry or ".").startswith(root) for root in installed)
    ]
    return os.pathsep.join(dict.fromkeys([*given, *added]))


def jvm_temporary_files_in(folder: Path, submit_options: str = "") -> str:
    """``$SPARK_SUBMIT_OPTS`` (``submit_options``, kept) with the driver JVM's temporary files in ``folder``: what
    Spark and its libraries put in ``java.io.tmpdir`` (Spark's own folders of the session, the native Snappy and LZ4
    libraries they unpack) is deleted only by the JVM's exit hooks, which a SIGKILL never runs: in /tmp, every crash
    the harness makes left them there. In the run's scratch folder, :meth:`PipelineChild.close` removes them.

    >>> jvm_temporary_files_in(Path("/runs/a b"), "-Xss4m")
    "-Xss4m '-Djava.io.tmpdir=/runs/a b'"
    """
    return " ".join(part for part in (submit_options, shlex.quote(f"-Djava.io.tmpdir={folder}")) if part)


def on_another_host(host: str, command: list[str]) -> list[str]:
    """``command`` run as on another machine: UTS and PID namespaces of its own (``unshare``, as root), its hostname
    ``host``: its pids mean nothing to this host's processes, and theirs nothing to it.

    >>> on_another_host("host-b", ["true"])[:3]
    ['unshare', '--uts', '--pid']
    """
    return ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "sh", "-c", f'hostname {host} && exec "$@"', host,
            *command]  # fmt: skip


def other_hosts_possible() -> bool:
    """Whether :func:`on_another_host` can run here: ``unshare`` on the PATH, and root."""
    return shutil.which("unshare") is not None and os.geteuid() == 0


class PipelineChild:
    """``streamproof run PIPELINE`` in its own session; its events recorded as they arrive (see the module)."""

    def __init__(
        self,
        pipeline_file: Path,
        log_dir: Path,
        *,
        name: str = "run",
        available_now: bool = True,
        crash: ArmedCrash | list[ArmedCrash] | None = None,
        jit: str = "quick-start",
        on_event: Callable[[Event], None] | None = None,
        standby: bool = False,
        warm_up: bool = False,
        arguments: list[str] | None = None,
        environment: dict[str, str] | None = None,
        host: str | None = None,
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"  # stderr: Spark's and Python's logs
        self.out_path = log_dir / f"{name}.out"  # stdout: the lines for people
        self.scratch = log_dir / f"{name}.spark-local"  # Spark's local dirs of this run, and its JVM's temporary files
        self.scratch.mkdir(parents=True, exist_ok=True)
        read_end, write_end = os.pipe()
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "SPARK_LOCAL_DIRS": str(self.scratch),
            "SPARK_SUBMIT_OPTS": jvm_temporary_files_in(self.scratch, os.environ.get("SPARK_SUBMIT_OPTS", "")),
            EVENTS_FD_ENV: str(write_end),
        }
        env.setdefault(JIT_ENV, jit)  # the harness's runs live seconds: C1 only halves their CPU on 2 cores
        env.setdefault(UI_ENV, "off")  # ... and would race each other and a user's run for Spark's UI port
        env.pop(CRASH_ENV, None)
        crashes = [crash] if isinstance(crash, ArmedCrash) else crash or []
        if crashes:
            env[CRASH_ENV] = ",".join(armed.encode() for armed in crashes)
        env[FAULT_DIR_ENV] = str(log_dir / "faults")  # the marker files of faults met in tasks
        env.update(environment or {})
        env["PYTHONPATH"] = import_path()  # your code (a transform, a sink) imports in the run as it does here
        command = [sys.executable, "-m", "streamproof", "run", str(pipeline_file)]
        if available_now:
            command.append("--available-now")
        if standby:  # waits warm while another process runs the pipeline (streamproof.pipeline.standby)
            command.append("--standby")
        if warm_up:  # runs the batch path on scratch copies before reading (streamproof.pipeline.warm_up)
            command.append("--warm-up")
        command += arguments or []  # a job file's: its maps, its state folder, its own arguments (streamproof.jobs)
        if host is not None:  # as on another machine: UTS and PID namespaces of its own (as root), named ``host``
            command = on_another_host(host, command)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                pass_fds=(write_end,),
            )
        os.close(write_end)  # the child holds the only write end: its end of file is the child's end
        self.started_at = time.monotonic()
        self.closed_at: float | None = None
        self._lock = threading.Lock()
        self._record: list[tuple[float, Event]] = []
        self._queue: queue.Queue[tuple[float, Event | None]] = queue.Queue()
        self._on_event = on_event  # called as each event arrives (on the reading thread)
        self._copy = threading.Thread(target=self._copy_stdout, daemon=True)
        self._copy.start()
        self._pump = threading.Thread(target=self._read_events, args=(read_end,), daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int:
        """The child's pid, which is also its process group's id."""
        return self.process.pid

    def _copy_stdout(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout as lines, open(self.out_path, "ab") as out:
            for line in lines:
                out.write(line)
                out.flush()

    def _read_events(self, read_end: int) -> None:
        with os.fdopen(read_end, encoding="utf-8") as stream:
            for line in stream:
                event = decode(line)
                at = time.monotonic()
                with self._lock:
                    self._record.append((at, event))
                self._queue.put((at, event))
                if self._on_event is not None:
                    self._on_event(event)
        self._copy.join()  # the end of stdout: the JVM, which holds it too, is gone as well
        self._queue.put((time.monotonic(), None))

    def next_event(self, timeout_s: float) -> tuple[float, Event | None] | None:
        """The next (arrival time, event) in order; event None: the child closed its channel (it exited).
        None when nothing came within ``timeout_s``."""
        if self.closed_at is not None:
            return self.closed_at, None
        try:
            at, event = self._queue.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        if event is None:
            self.closed_at = at
        return at, event

    def batches(self) -> list[tuple[float, BatchCommitted]]:
        """Every batch committed so far, with its arrival time."""
        with self._lock:
            return [(at, event) for at, event in self._record if isinstance(event, BatchCommitted)]

    def notices(self, kind: str) -> list[str]:
        """The texts of the notices of ``kind`` so far, in order (a standby's ``standby`` notices, say)."""
        with self._lock:
            return [event.text for _, event in self._record if isinstance(event, Notice) and event.kind == kind]

    def notice_at(self, kind: str) -> float | None:
        """Arrival time of the first notice of ``kind`` (``ready``, ``started``), if it came."""
        with self._lock:
            return next((at for at, event in self._record if isinstance(event, Notice) and event.kind == kind), None)

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Wait until ``condition()``; the child exiting first, or the timeout (the child is then killed), is an
        error naming ``what`` and the log."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.process.poll() is not None:
                raise PipelineError(
                    f"the pipeline exited (code {self.process.returncode}) before {what}; log: {self.log_path}"
                )
            if time.monotonic() > deadline:
                self.kill_tree()
                raise PipelineError(f"no {what} within {timeout_s:.0f} s (pipeline killed); log: {self.log_path}")
            time.sleep(0.02)

    def error_line(self) -> str | None:
        """The CLI's one-line error of this run (``error: ...`` in its log), if it printed one."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return None
        return next((line for line in reversed(lines) if line.startswith("error: ")), None)

    def wait(self, timeout_s: float = RUN_TIMEOUT_S) -> int:
        """Wait for the child to exit and its events to be read; its exit code. Past ``timeout_s`` it is killed and
        that is an error."""
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_tree()
            raise PipelineError(
                f"pipeline run did not finish within {timeout_s:.0f} s (killed); log: {self.log_path}"
            ) from None
        self._pump.join(timeout=30)
        return code

    def terminate(self) -> None:
        """SIGTERM: the pipeline finishes its batch in flight and exits 0."""
        os.kill(self.pid, signal.SIGTERM)

    def kill_tree(self) -> float:
        """SIGKILL the run's whole process tree: driver, JVM and PySpark's workers (their own group); returns
        the moment of the kill (monotonic)."""
        at = time.monotonic()
        kill_process_tree(self.pid)
        self.process.wait(timeout=60)
        self._pump.join(timeout=30)
        return at

    def close(self) -> None:
        """Kill what still runs, and remove the run's Spark scratch folder."""
        if self.process.poll() is None:
            self.kill_tree()
        shutil.rmtree(self.scratch, ignore_errors=True)
