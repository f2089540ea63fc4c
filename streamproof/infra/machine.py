"""``streamproof setup``: what this machine needs to run and prove jobs, checked, and made once where it can be.

For a team that adds streamproof to the environment its job already runs in (``pip install`` of the wheel, no
checkout): Java 17 is checked, the jars are resolved with Maven into the cache (:mod:`streamproof.jvm.jars`, once;
a second run finds them there and touches no network), the JVM's class-data archive is made
(:mod:`streamproof.jvm.archive`). Each thing is one line: ok, made, or missing with the command that installs it.
Optional things (PostgreSQL for ``infra up --postgres``) are said, never required.

Example::

    $ streamproof setup
    java: 17 (ok)
    maven: /usr/bin/mvn (ok)
    jars spark: 56 in ~/.cache/streamproof/jars/spark-e11c33fcec926b78 (cached)
    ...
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from streamproof.errors import SetupError
from streamproof.infra.postgres import postgres_bin_dir
from streamproof.jvm.archive import prepare_startup_archive
from streamproof.jvm.jars import JAR_SETS, check_java, jar_set, resolve

Say = Callable[[str], None]
POSTGRES_HINT = "apt-get install -y postgresql-15 (only for `streamproof infra up --postgres`)"


@dataclass
class Readiness:
    """What :func:`get_ready` found: the lines it said, and the things missing (the command fails on any)."""

    lines: list[str]
    missing: list[str]

    @property
    def ready(self) -> bool:
        return not self.missing


def get_ready(say: Say = print, *, archive: bool = True) -> Readiness:
    """Check Java and Maven, resolve every jar set, make the class-data archive; one line each (see the module)."""
    found = Readiness([], [])

    def line(text: str, missing: bool = False) -> None:
        found.lines.append(text)
        if missing:
            found.missing.append(text)
        say(text)

    try:
        line(f"java: {check_java()} (ok)")
    except SetupError as error:
        line(f"java: missing: {error}", missing=True)
    mvn = shutil.which("mvn")
    unresolved = [name for name in JAR_SETS if not (jar_set(name).folder() / ".complete").exists()]
    if mvn is None and unresolved:
        line("maven: missing: apt-get install -y maven (needed once, to resolve the jars)", missing=True)
    elif mvn is not None:
        line(f"maven: {mvn} (ok)")
    if found.missing:
        return found
    for name in JAR_SETS:
        started = time.monotonic()
        cached = name not in unresolved
        try:
            jars = resolve(name)
        except SetupError as error:
            line(f"jars {name}: missing: {error}", missing=True)
            continue
        how = "cached" if cached else f"resolved in {time.monotonic() - started:.0f} s"
        line(f"jars {name}: {len(jars)} in {jar_set(name).folder()} ({how})")
    if archive and not found.missing:  # starts a JVM: only once the jars are there
        started = time.monotonic()
        made = prepare_startup_archive()
        line(f"class-data archive: {made} ({time.monotonic() - started:.0f} s)")
    postgres = _postgres_bin()
    line(f"postgresql: {postgres} (ok)" if postgres else f"postgresql: not installed (optional): {POSTGRES_HINT}")
    return found


def _postgres_bin() -> str | None:
    try:
        return str(postgres_bin_dir())
    except Exception:  # noqa: BLE001 - not installed: said as optional
        return None
