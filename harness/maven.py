"""Java and Maven discovery for Apache Pulsar standalone, and its classpath resolved with Maven.

The Maven project ``harness/broker/`` (``org.apache.pulsar:pulsar-broker`` :data:`APACHE_PULSAR_VERSION`
plus a small main class) is resolved once into ``~/.m2``; its runtime classpath is cached in
``harness/broker/target/classpath.txt``, so later starts need only Java. ``$PULSAR_NACK_BROKER_PROJECT``
points at another copy of that project.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from pulsar_nack.testing import BrokerError, file_tail

__all__ = [
    "APACHE_PULSAR_VERSION",
    "STANDALONE_MAIN",
    "apache_pulsar_available",
    "classpath_file",
    "default_maven_project",
    "java_available",
    "java_binary",
    "maven_available",
    "resolve_classpath",
]

_log = logging.getLogger(__name__)

#: The Apache Pulsar release pinned in ``harness/broker/pom.xml`` (4.0.x LTS). 4.0.8 is listed on Maven
#: Central but two of its modules (jetcd-core-shaded, pulsar-opentelemetry) cannot be downloaded
#: from the registry these machines reach, so 4.0.7 is the newest 4.0.x that resolves.
APACHE_PULSAR_VERSION = "4.0.7"

#: Main class in ``harness/broker/``: expires ephemeral metadata left by a SIGKILLed run, then runs
#: ``org.apache.pulsar.PulsarStandaloneStarter`` in the same JVM.
STANDALONE_MAIN = "io.github.pulsarnack.standalone.StandaloneMain"


def java_binary() -> str | None:
    """``$JAVA_HOME/bin/java`` if set and present, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("java")


def java_available(min_version: int = 17) -> tuple[bool, str]:
    """Whether a Java runtime able to run Apache Pulsar 4.0 (Java >= 17) is installed.

    Returns ``(True, "java 17.0.15 at /usr/bin/java")`` or ``(False, reason)``.
    """
    java = java_binary()
    if java is None:
        return False, "no `java` on PATH and no usable $JAVA_HOME (Apache Pulsar needs Java 17+)"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"`{java} -version` failed: {exc}"
    text = out.stderr + out.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?[^"]*"', text)
    if match is None:
        return False, f"cannot parse the output of `{java} -version`: {text.strip()[:200]!r}"
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_392" style
        major = int(match.group(2))
    if major < min_version:
        return False, f"{java} is Java {major}; Apache Pulsar 4.0 needs Java {min_version}+"
    version = text.split('"')[1] if '"' in text else str(major)
    return True, f"java {version} at {java}"


def maven_available() -> tuple[bool, str]:
    """Whether ``mvn`` is on PATH (needed once, to resolve Apache Pulsar into ``~/.m2``)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        return False, "no `mvn` on PATH (Maven resolves Apache Pulsar from Maven Central)"
    return True, f"maven at {mvn}"


def default_maven_project() -> Path:
    """``$PULSAR_NACK_BROKER_PROJECT`` if set, else ``harness/broker/`` of this repository."""
    env = os.environ.get("PULSAR_NACK_BROKER_PROJECT")
    return Path(env) if env else Path(__file__).resolve().parent / "broker"


def apache_pulsar_available(maven_project: Path | None = None) -> tuple[bool, str]:
    """Whether :class:`PulsarStandalone` can start here: Java, plus Maven or a resolved classpath.

    Maven is only required while ``harness/broker/target/classpath.txt`` is missing or stale.
    """
    ok, java_reason = java_available()
    if not ok:
        return False, java_reason
    project = maven_project or default_maven_project()
    if not (project / "pom.xml").is_file():
        return False, f"no Maven project at {project} (set PULSAR_NACK_BROKER_PROJECT)"
    if _classpath_if_fresh(project) is not None:
        return True, f"{java_reason}; classpath already resolved in {project / 'target'}"
    ok, mvn_reason = maven_available()
    if not ok:
        return False, f"{mvn_reason}, and {project}/target/classpath.txt is not resolved yet"
    return True, f"{java_reason}; {mvn_reason}"


def classpath_file(project: Path) -> Path:
    """Where the Maven project's resolved runtime classpath is cached."""
    return project / "target" / "classpath.txt"


def _classpath_if_fresh(project: Path) -> str | None:
    """The runtime classpath (compiled classes first) if it is up to date, else None.

    Up to date: ``target/classpath.txt`` is newer than the POM and every Java source, the compiled
    main class exists and every jar listed exists.
    """
    cp_file = classpath_file(project)
    classes = project / "target" / "classes"
    try:
        built = cp_file.stat().st_mtime
        inputs = [project / "pom.xml", *(project / "src").rglob("*.java")]
        if any(p.stat().st_mtime > built for p in inputs):
            return None
        if not (classes / (STANDALONE_MAIN.replace(".", "/") + ".class")).is_file():
            return None
        jars = [e for e in cp_file.read_text().strip().split(os.pathsep) if e]
    except OSError:
        return None
    if not jars or not all(os.path.exists(e) for e in jars):
        return None
    return os.pathsep.join([str(classes), *jars])


def resolve_classpath(project: Path, timeout: float) -> str:
    """Resolve Apache Pulsar with Maven (once) and return its runtime classpath.

    Serialised with a file lock, so parallel test sessions run Maven once between them.
    """
    classpath = _classpath_if_fresh(project)
    if classpath is not None:
        return classpath
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(maven_available()[1])
    target = project / "target"
    target.mkdir(parents=True, exist_ok=True)
    with (target / ".classpath.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        classpath = _classpath_if_fresh(project)
        if classpath is not None:
            return classpath
        tmp = target / f"classpath.txt.{os.getpid()}.tmp"
        log_path = target / "maven.log"
        cmd = [mvn, "-B", "-q", "-f", str(project / "pom.xml")]
        settings = project / "settings.xml"
        if settings.is_file():
            cmd += ["-s", str(settings)]
        cmd += ["compile", "dependency:build-classpath", f"-Dclasspath.file={tmp}"]
        _log.info("resolving Apache Pulsar with Maven (first run downloads ~270 MB into ~/.m2): %s", cmd)
        started = time.monotonic()
        with log_path.open("wb") as log_file:
            try:
                proc = subprocess.run(
                    cmd,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise BrokerError(
                    f"Maven did not resolve Apache Pulsar within {timeout:.0f}s; "
                    f"log {log_path}:\n{file_tail(log_path)}"
                ) from exc
        if proc.returncode != 0 or not tmp.is_file():
            raise BrokerError(
                f"Maven failed (exit {proc.returncode}) resolving Apache Pulsar; "
                f"log {log_path}:\n{file_tail(log_path)}"
            )
        os.replace(tmp, classpath_file(project))
        _log.info("Maven resolved Apache Pulsar in %.1fs", time.monotonic() - started)
    classpath = _classpath_if_fresh(project)
    if classpath is None:
        raise BrokerError(f"Maven wrote {classpath_file(project)} but some jars are missing")
    return classpath
