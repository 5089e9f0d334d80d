"""Real Pulsar brokers for tests, demos and benchmarks, each started as one local process.

Two brokers share one interface (:class:`Broker`):

* :class:`PulsarLite` -- the pulsar-lite binary shipped inside the ``pulsar-lite`` wheel. Starts in
  milliseconds; it does not implement everything Apache Pulsar does (no delayed delivery, no nack
  redelivery on partitioned topics, ...): tests of those run on :class:`PulsarStandalone`.
* :class:`PulsarStandalone` -- Apache Pulsar standalone (broker + bookie + RocksDB metadata store in
  one JVM), from the Maven project in ``broker/`` of this repository. Needs Java 17+ and, the first
  time, Maven (it resolves ``org.apache.pulsar:pulsar-broker`` into ``~/.m2`` and writes the runtime
  classpath to ``broker/target/classpath.txt``; later starts need only Java).

The one obvious entry point is :func:`start_broker`::

    from pulsar_nack.broker import start_broker

    with start_broker("lite") as broker:          # or "apache"
        client = pulsar.Client(broker.service_url)
        ...

Every listener is bound to 127.0.0.1 on a free port. Processes are started directly (the PID we
hold is the broker itself, never a wrapper shell), stopped by that PID (SIGTERM, then SIGKILL after a
timeout) and never by name. Data lives in a temporary directory that :meth:`Broker.stop` removes,
unless the caller passed its own ``data_dir``. :meth:`Broker.restart` keeps ports and data, so
unacknowledged messages survive it; :meth:`Broker.kill` simulates a crash (SIGKILL) and a later
:meth:`Broker.start` recovers from the same data.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar, Literal, Self

__all__ = [
    "APACHE_PULSAR_VERSION",
    "Broker",
    "BrokerError",
    "PulsarLite",
    "PulsarStandalone",
    "SettingValue",
    "apache_pulsar_available",
    "broker_url",
    "free_ports",
    "java_available",
    "maven_available",
    "start_broker",
]

_log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"

#: The Apache Pulsar release pinned in ``broker/pom.xml`` (4.0.x LTS). 4.0.8 is listed on Maven
#: Central but two of its modules (jetcd-core-shaded, pulsar-opentelemetry) cannot be downloaded
#: from the registry these machines reach, so 4.0.7 is the newest 4.0.x that resolves.
APACHE_PULSAR_VERSION = "4.0.7"

#: Main class in ``broker/``: expires ephemeral metadata left by a SIGKILLed run, then runs
#: ``org.apache.pulsar.PulsarStandaloneStarter`` in the same JVM.
STANDALONE_MAIN = "io.github.pulsarnack.standalone.StandaloneMain"

#: A broker setting value: written as ``true``/``false`` for booleans, ``str()`` otherwise.
SettingValue = str | int | float | bool

_REPO_ROOT = Path(__file__).resolve().parent.parent


class BrokerError(RuntimeError):
    """A broker could not be prepared, started, reached or stopped."""


# ---------------------------------------------------------------------------------------------
# small helpers


def free_ports(count: int = 1) -> list[int]:
    """Return ``count`` distinct TCP ports that are free on 127.0.0.1 right now.

    All sockets are held open until every port is picked, so the ports are distinct; another
    process may still take one before the caller binds it (the broker then fails to start with a
    clear error).
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _port_accepts(port: int, timeout: float = 0.25) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (a zombie counts as alive until reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _loopback_interface() -> str:
    """Name of the loopback network interface (``lo`` on Linux)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return "lo"
    if "lo" in names:
        return "lo"
    return next((n for n in names if n.startswith("lo")), "lo")


# ---------------------------------------------------------------------------------------------
# Java / Maven discovery


def _java_binary() -> str | None:
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
    java = _java_binary()
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


def _default_maven_project() -> Path:
    env = os.environ.get("PULSAR_NACK_BROKER_PROJECT")
    return Path(env) if env else _REPO_ROOT / "broker"


def apache_pulsar_available(maven_project: Path | None = None) -> tuple[bool, str]:
    """Whether :class:`PulsarStandalone` can start here: Java, plus Maven or a resolved classpath.

    Maven is only required while ``broker/target/classpath.txt`` is missing or stale.
    """
    ok, java_reason = java_available()
    if not ok:
        return False, java_reason
    project = maven_project or _default_maven_project()
    if not (project / "pom.xml").is_file():
        return False, f"no Maven project at {project} (set PULSAR_NACK_BROKER_PROJECT)"
    if _classpath_if_fresh(project) is not None:
        return True, f"{java_reason}; classpath already resolved in {project / 'target'}"
    ok, mvn_reason = maven_available()
    if not ok:
        return False, f"{mvn_reason}, and {project}/target/classpath.txt is not resolved yet"
    return True, f"{java_reason}; {mvn_reason}"


def _classpath_file(project: Path) -> Path:
    return project / "target" / "classpath.txt"


def _classpath_if_fresh(project: Path) -> str | None:
    """The runtime classpath (compiled classes first) if it is up to date, else None.

    Up to date: ``target/classpath.txt`` is newer than the POM and every Java source, the compiled
    main class exists and every jar listed exists.
    """
    cp_file = _classpath_file(project)
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


def _resolve_classpath(project: Path, timeout: float) -> str:
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
                    f"log {log_path}:\n{_tail(log_path)}"
                ) from exc
        if proc.returncode != 0 or not tmp.is_file():
            raise BrokerError(
                f"Maven failed (exit {proc.returncode}) resolving Apache Pulsar; "
                f"log {log_path}:\n{_tail(log_path)}"
            )
        os.replace(tmp, _classpath_file(project))
        _log.info("Maven resolved Apache Pulsar in %.1fs", time.monotonic() - started)
    classpath = _classpath_if_fresh(project)
    if classpath is None:
        raise BrokerError(f"Maven wrote {_classpath_file(project)} but some jars are missing")
    return classpath


# ---------------------------------------------------------------------------------------------
# the shared process life cycle

_LIVE: weakref.WeakSet[Broker] = weakref.WeakSet()


_OWNER_FILE = ".pulsar-nack-owner.json"
_TEMP_PREFIX = "pulsar-nack-"
_swept = False


def _sweep_stale_temp_dirs() -> None:
    """Remove temp data dirs of brokers whose starter and broker processes are both gone.

    A test run killed with SIGKILL/SIGTERM cannot clean up after itself; its broker dies with it
    (``die_with_parent``) and the next run removes the directory here. Directories without an
    owner file, kept on purpose (``keep_data_dir``) or with a live PID are left alone.
    """
    global _swept
    if _swept:
        return
    _swept = True
    for kind in ("lite", "apache"):
        for path in Path(tempfile.gettempdir()).glob(f"{_TEMP_PREFIX}{kind}-*"):
            try:
                owner = json.loads((path / _OWNER_FILE).read_text())
                if owner.get("keep") or any(_pid_alive(int(p)) for p in owner["pids"]):
                    continue
            except (OSError, ValueError, KeyError, TypeError):
                continue
            _log.info("removing stale broker data dir %s (its processes are gone)", path)
            shutil.rmtree(path, ignore_errors=True)


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop every broker this interpreter started and did not stop (normal interpreter exit)."""
    for broker in list(_LIVE):
        with contextlib.suppress(Exception):
            broker.stop()


class Broker(ABC):
    """One local broker process with a start/stop/restart/kill life cycle.

    Subclasses say how to prepare the data directory, which command to run and when the broker is
    ready. A broker object can be started again after :meth:`stop` (with a fresh temporary data
    directory if it owned the previous one) and keeps its ports for its whole life.
    """

    #: Short name used in logs, temp dir prefixes and test ids.
    kind: ClassVar[str] = "broker"
    #: Name of the broker's log file inside the data directory.
    log_name: ClassVar[str] = "broker.log"

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 30.0,
        keep_data_dir: bool | None = None,
        die_with_parent: bool = True,
    ) -> None:
        """Create (but do not start) a broker.

        Args:
            data_dir: directory for data, config and log. If None a temporary directory is
                created on start and removed by :meth:`stop` (unless ``keep_data_dir``); a
                caller's directory is never removed.
            start_timeout: seconds :meth:`start` waits for the broker to become ready.
            stop_timeout: seconds :meth:`stop` waits after SIGTERM before it sends SIGKILL.
            keep_data_dir: keep the temporary data directory (and the log in it) on
                :meth:`stop`, for debugging; None: keep it if ``$PULSAR_NACK_KEEP_BROKER_DATA``
                is set to 1.
            die_with_parent: ask Linux to SIGTERM the broker if the thread that started it dies
                (via ``setpriv --pdeathsig``, which execs the broker, so the PID stays the
                broker's). Keeps a killed test run from leaking brokers. Turn it off when a
                short-lived thread starts a broker that must outlive it.
        """
        self._own_data_dir = data_dir is None
        self._data_dir: Path | None = None if data_dir is None else Path(data_dir).resolve()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        if keep_data_dir is None:
            keep_data_dir = os.environ.get("PULSAR_NACK_KEEP_BROKER_DATA", "") in ("1", "true")
        self.keep_data_dir = keep_data_dir
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._prepared = False
        self._lock = threading.RLock()

    # -- public properties ---------------------------------------------------------------------

    @property
    @abstractmethod
    def service_url(self) -> str:
        """Pulsar binary-protocol URL, ``pulsar://127.0.0.1:PORT``."""

    @property
    def data_dir(self) -> Path:
        """Directory holding this broker's data, config and log (created on first start)."""
        if self._data_dir is None:
            raise BrokerError(f"{self.kind} broker has not been started yet: no data dir")
        return self._data_dir

    @property
    def log_path(self) -> Path:
        """The broker's log file (stdout and stderr), inside :attr:`data_dir`."""
        return self.data_dir / self.log_name

    @property
    def pid(self) -> int | None:
        """PID of the running broker process, None when not running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the broker process is alive."""
        return self.pid is not None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the broker log."""
        if self._data_dir is None:
            return ""
        return _tail(self.log_path, lines)

    # -- life cycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the broker and wait until it is ready; a no-op if it is already running.

        Raises:
            BrokerError: the broker exited, or was not ready within ``start_timeout`` (the
                process is then killed); the message carries the tail of its log.
        """
        with self._lock:
            if self.running:
                return self
            if self._data_dir is None:
                _sweep_stale_temp_dirs()
                self._data_dir = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{self.kind}-"))
                self._prepared = False
            self._data_dir.mkdir(parents=True, exist_ok=True)
            if not self._prepared:
                self._prepare()
                self._prepared = True
            self._launch()
            if self._own_data_dir:
                assert self._proc is not None
                owner = {"pids": [os.getpid(), self._proc.pid], "keep": self.keep_data_dir}
                (self._data_dir / _OWNER_FILE).write_text(json.dumps(owner))
            deadline = time.monotonic() + self.start_timeout
            try:
                self._wait_ready(deadline)
            except BaseException:
                self._terminate(sig=signal.SIGKILL, timeout=10.0)
                raise
            _LIVE.add(self)
            return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``timeout``) and remove its temp dir.

        Safe to call more than once and after :meth:`kill`.
        """
        with self._lock:
            self._terminate(sig=signal.SIGTERM, timeout=self.stop_timeout if timeout is None else timeout)
            _LIVE.discard(self)
            if self._own_data_dir and self._data_dir is not None and not self.keep_data_dir:
                shutil.rmtree(self._data_dir, ignore_errors=True)
                self._data_dir = None
                self._prepared = False

    def restart(self, timeout: float | None = None) -> None:
        """Stop the broker gracefully and start it again on the same ports with the same data."""
        with self._lock:
            self._terminate(sig=signal.SIGTERM, timeout=self.stop_timeout if timeout is None else timeout)
            self.start()

    def kill(self) -> None:
        """SIGKILL the broker (a crash). Data and ports are kept: :meth:`start` recovers."""
        with self._lock:
            self._terminate(sig=signal.SIGKILL, timeout=10.0)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<{type(self).__name__} {self.service_url} {state}>"

    # -- topics --------------------------------------------------------------------------------

    @abstractmethod
    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        """Create a partitioned topic with ``partitions`` partitions."""

    # -- subclass hooks ----------------------------------------------------------------------------

    @abstractmethod
    def _prepare(self) -> None:
        """Write config files into :attr:`data_dir` (called before the first start in a dir)."""

    @abstractmethod
    def _command(self) -> list[str]:
        """The broker's command line (the process must be the broker itself, not a wrapper)."""

    @abstractmethod
    def _ready(self) -> bool:
        """One readiness probe (cheap, bounded in time)."""

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    # -- process handling ------------------------------------------------------------------------

    def _launch(self) -> None:
        cmd = self._command()
        if self.die_with_parent and shutil.which("setpriv"):
            # setpriv execs the broker: the PID we hold stays the broker's own.
            cmd = [str(shutil.which("setpriv")), "--pdeathsig", "TERM", "--", *cmd]
        if self._log_file is not None:
            self._log_file.close()
        self._log_file = self.log_path.open("ab")
        self._log_file.write(f"\n==== pulsar-nack: starting {cmd!r}\n".encode())
        self._log_file.flush()
        _log.info("starting %s broker: %s", self.kind, " ".join(cmd)[:500])
        self._proc = subprocess.Popen(
            cmd,
            cwd=self.data_dir,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # no terminal Ctrl-C straight to the broker; we stop it
        )

    def _wait_ready(self, deadline: float) -> None:
        proc = self._proc
        assert proc is not None
        while True:
            code = proc.poll()
            if code is not None:
                raise BrokerError(
                    f"{self.kind} broker exited with code {code} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self._ready():
                _log.info("%s broker ready at %s (pid %d)", self.kind, self.service_url, proc.pid)
                return
            if time.monotonic() >= deadline:
                raise BrokerError(
                    f"{self.kind} broker (pid {proc.pid}) not ready within "
                    f"{self.start_timeout:.0f}s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.05 if self.kind == "lite" else 0.2)

    def _terminate(self, *, sig: signal.Signals, timeout: float) -> None:
        """Signal our process by PID, wait ``timeout``, then SIGKILL; reap it; close the log."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            _log.info("stopping %s broker pid %d with %s", self.kind, proc.pid, sig.name)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _log.warning(
                    "%s broker pid %d ignored %s for %.0fs: SIGKILL",
                    self.kind,
                    proc.pid,
                    sig.name,
                    timeout,
                )
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=30)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


# ---------------------------------------------------------------------------------------------
# pulsar-lite


def _toml_value(value: SettingValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


def _pulsar_lite_binary() -> Path:
    env = os.environ.get("PULSAR_LITE_BINARY")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("pulsar_lite")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerError("the pulsar-lite package is not installed (pip install pulsar-lite)")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "pulsar-lite"
        if candidate.is_file():
            return candidate
    raise BrokerError("the pulsar-lite package has no bin/pulsar-lite binary")


class PulsarLite(Broker):
    """The pulsar-lite broker (Rust, RocksDB) shipped in the ``pulsar-lite`` wheel.

    Runs ``pulsar-lite --config FILE --addr 127.0.0.1:PORT --db-path DIR/db`` with a TOML config
    that pins its Prometheus listener to 127.0.0.1 (never its default 0.0.0.0:8080). Data persists
    in ``DIR/db.rocksdb`` across :meth:`restart` and :meth:`kill`.
    """

    kind = "lite"
    log_name = "pulsar-lite.log"

    def __init__(
        self,
        *,
        default_partitions: int = 0,
        log_level: str = "info",
        metrics: bool = True,
        extra_config: Mapping[str, SettingValue] | None = None,
        binary: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 15.0,
        stop_timeout: float = 10.0,
        keep_data_dir: bool | None = None,
        die_with_parent: bool = True,
    ) -> None:
        """Create (but do not start) a pulsar-lite broker.

        Args:
            default_partitions: partitions of every auto-created topic (0: non-partitioned).
                This config key is pulsar-lite's only way to get partitioned topics.
            log_level: error, warn, info, debug or trace.
            metrics: serve Prometheus metrics on 127.0.0.1:<free port> (:attr:`metrics_url`);
                False disables the listener.
            extra_config: further top-level keys of pulsar-lite's TOML config (e.g.
                ``max_message_size_bytes``).
            binary: the pulsar-lite executable (default: ``$PULSAR_LITE_BINARY``, else the one in
                the installed wheel).
            data_dir, start_timeout, stop_timeout, keep_data_dir, die_with_parent: see
                :class:`Broker`.
        """
        super().__init__(
            data_dir=data_dir,
            start_timeout=start_timeout,
            stop_timeout=stop_timeout,
            keep_data_dir=keep_data_dir,
            die_with_parent=die_with_parent,
        )
        if default_partitions < 0:
            raise ValueError("default_partitions must be >= 0")
        self.default_partitions = default_partitions
        self.log_level = log_level
        self.metrics = metrics
        self.extra_config = dict(extra_config or {})
        self.binary = Path(binary) if binary is not None else _pulsar_lite_binary()
        self.port, self.metrics_port = free_ports(2)

    @property
    def service_url(self) -> str:
        """``pulsar://127.0.0.1:PORT``."""
        return f"pulsar://{LOOPBACK}:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        """Prometheus endpoint, or None when metrics are disabled."""
        return f"http://{LOOPBACK}:{self.metrics_port}/metrics" if self.metrics else None

    @property
    def config_path(self) -> Path:
        """The TOML config file written into the data dir."""
        return self.data_dir / "pulsar-lite.toml"

    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        """Not supported: pulsar-lite has no admin API.

        Raises:
            NotImplementedError: always. Partitioned topics come from ``default_partitions``:
                with ``PulsarLite(default_partitions=N)`` every auto-created topic has N
                partitions.
        """
        raise NotImplementedError(
            "pulsar-lite has no admin API: partitioned topics come only from its config. "
            f"Use PulsarLite(default_partitions={partitions}) and every auto-created topic "
            f"(including {topic!r}) gets {partitions} partitions."
        )

    def _prepare(self) -> None:
        lines = [
            "# written by pulsar_nack.broker.PulsarLite",
            f"default_partitions = {self.default_partitions}",
            f"log_level = {_toml_value(self.log_level)}",
        ]
        for key, value in self.extra_config.items():
            if not re.fullmatch(r"[A-Za-z0-9_]+", key) or key == "metrics":
                raise ValueError(f"unsupported pulsar-lite config key {key!r}")
            lines.append(f"{key} = {_toml_value(value)}")
        lines += [
            "",
            "[metrics]",
            f"enabled = {_toml_value(self.metrics)}",
            f'addr = "{LOOPBACK}:{self.metrics_port}"',
            "",
        ]
        self.config_path.write_text("\n".join(lines))

    def _command(self) -> list[str]:
        return [
            str(self.binary),
            "--config",
            str(self.config_path),
            "--addr",
            f"{LOOPBACK}:{self.port}",
            "--db-path",
            str(self.data_dir / "db"),
            "--log-level",
            self.log_level,
        ]

    def _ready(self) -> bool:
        return _port_accepts(self.port)


# ---------------------------------------------------------------------------------------------
# Apache Pulsar standalone

_JVM_MODULE_OPTIONS = (
    # What Pulsar's own bin/pulsar passes on Java 17 (netty, metrics, checksums).
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens=java.base/sun.net=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.platform=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
)

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!-- written by pulsar_nack.broker.PulsarStandalone: everything to stdout (the broker log file) -->
<Configuration status="warn">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="%d{{ISO8601}} %-5p [%t] %c{{1}} - %m%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="{level}"><AppenderRef ref="stdout"/></Root>
  </Loggers>
</Configuration>
"""


#: Setting names that look right but that Pulsar ignores silently -> the real name.
_MISNAMED_SETTINGS = {
    "delayedDeliveryMaxDeliveryDelayInMillis": "delayedDeliveryMaxDelayInMillis",  # PIP-315
    "delayedDeliveryDeliverAtTimeStrict": "isDelayedDeliveryDeliverAtTimeStrict",
    "maxDeliveryDelayInMillis": "delayedDeliveryMaxDelayInMillis",
}


class PulsarStandalone(Broker):
    """Apache Pulsar standalone: broker + bookie + RocksDB metadata store in one JVM.

    Runs ``java -cp <classpath> io.github.pulsarnack.standalone.StandaloneMain --config FILE
    --no-functions-worker --no-stream-storage ...`` directly (the PID is the JVM's; that main
    class expires ephemeral metadata a SIGKILLed run left behind -- with Pulsar's RocksDB metadata
    store they otherwise make the bookie's registration flap after :meth:`kill` -- and then calls
    ``org.apache.pulsar.PulsarStandaloneStarter``), with a
    config written here: broker, web service and bookie on 127.0.0.1 free ports,
    ``acknowledgmentAtBatchIndexLevelEnabled=true``, ``delayedDeliveryEnabled=true`` with strict
    delivery times on a 100 ms tick, single-bookie ledgers, plus the caller's ``settings`` (which
    win; a few look-alike names Pulsar would ignore silently are rejected).

    PIP-315: the limit is ``delayedDeliveryMaxDelayInMillis``. With pulsar-client 3.13 a send whose
    ``deliver_after`` exceeds it never completes (the broker drops the connection, the client
    reconnects and resends), so keep test delays under the limit.

    The classpath comes from the Maven project ``broker/`` (``org.apache.pulsar:pulsar-broker``
    :data:`APACHE_PULSAR_VERSION`), resolved once into ``~/.m2`` and cached in
    ``broker/target/classpath.txt``.
    """

    kind = "apache"
    log_name = "broker.log"
    main_class: ClassVar[str] = STANDALONE_MAIN

    def __init__(
        self,
        *,
        settings: Mapping[str, SettingValue] | None = None,
        heap_mb: int = 1024,
        direct_memory_mb: int = 1024,
        c1_only: bool = True,
        jvm_options: Sequence[str] = (),
        log_level: str = "info",
        maven_project: str | os.PathLike[str] | None = None,
        maven_timeout: float = 1200.0,
        cluster_name: str = "standalone",
        data_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        keep_data_dir: bool | None = None,
        die_with_parent: bool = True,
    ) -> None:
        """Create (but do not start) an Apache Pulsar standalone.

        Args:
            settings: extra broker/bookie settings for the config file, e.g.
                ``{"delayedDeliveryMaxDelayInMillis": 60000}``; they override the
                harness defaults (but ports and bind addresses stay on loopback).
            heap_mb: -Xms/-Xmx of the JVM.
            direct_memory_mb: -XX:MaxDirectMemorySize (netty buffers, managed-ledger cache).
            c1_only: -XX:TieredStopAtLevel=1: starts ~40% faster on 2 cores; turn off for
                throughput benchmarks.
            jvm_options: further JVM options, appended last (so they win).
            log_level: log4j2 root level of the broker log.
            maven_project: the Maven project (default: ``$PULSAR_NACK_BROKER_PROJECT``, else
                ``broker/`` next to this package).
            maven_timeout: seconds allowed for the one-time Maven resolution.
            cluster_name: Pulsar cluster name.
            data_dir, start_timeout, stop_timeout, keep_data_dir, die_with_parent: see
                :class:`Broker`.
        """
        super().__init__(
            data_dir=data_dir,
            start_timeout=start_timeout,
            stop_timeout=stop_timeout,
            keep_data_dir=keep_data_dir,
            die_with_parent=die_with_parent,
        )
        self.settings = dict(settings or {})
        for key in self.settings:
            if key in _MISNAMED_SETTINGS:
                raise ValueError(
                    f"Pulsar {APACHE_PULSAR_VERSION} has no setting {key!r} (it would be ignored "
                    f"silently): use {_MISNAMED_SETTINGS[key]!r}"
                )
        self.heap_mb = heap_mb
        self.direct_memory_mb = direct_memory_mb
        self.c1_only = c1_only
        self.jvm_options = list(jvm_options)
        self.log_level = log_level
        self.maven_project = (
            Path(maven_project).resolve() if maven_project is not None else _default_maven_project()
        )
        self.maven_timeout = maven_timeout
        self.cluster_name = cluster_name
        self.port, self.web_port, self.bookie_port = free_ports(3)
        self._classpath: str | None = None

    # -- addresses -------------------------------------------------------------------------------

    @property
    def service_url(self) -> str:
        """``pulsar://127.0.0.1:PORT``."""
        return f"pulsar://{LOOPBACK}:{self.port}"

    @property
    def web_service_url(self) -> str:
        """``http://127.0.0.1:WEBPORT`` (admin REST API and /metrics)."""
        return f"http://{LOOPBACK}:{self.web_port}"

    @property
    def admin_url(self) -> str:
        """Same as :attr:`web_service_url`."""
        return self.web_service_url

    @property
    def config_path(self) -> Path:
        """The broker config file written into the data dir."""
        return self.data_dir / "conf" / "standalone.conf"

    # -- admin REST ------------------------------------------------------------------------------

    def admin(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        """Call the admin REST API: ``admin("GET", "/admin/v2/clusters")``.

        ``body`` is sent as JSON. Returns the decoded JSON answer (None for an empty one).

        Raises:
            BrokerError: HTTP error status (with the broker's reason) or connection failure.
        """
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.web_service_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace")
            raise BrokerError(f"{method} {path} -> HTTP {exc.code}: {detail}") from exc
        except OSError as exc:
            raise BrokerError(f"{method} {path} failed: {exc}") from exc
        return json.loads(raw) if raw.strip() else None

    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        """Create a partitioned topic through ``PUT /admin/v2/{domain}/{tenant}/{ns}/{name}/partitions``.

        ``topic`` is a full name (``persistent://public/default/x``) or a short one (``x``, put
        in ``public/default``).

        Raises:
            BrokerError: e.g. HTTP 409 if the topic already exists.
        """
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.admin("PUT", f"/admin/v2/{_topic_path(topic)}/partitions", partitions)

    # -- Broker hooks ----------------------------------------------------------------------------

    def _settings(self) -> dict[str, SettingValue]:
        """The config file's settings: harness defaults, the caller's, then forced loopback."""
        merged: dict[str, SettingValue] = {
            "clusterName": self.cluster_name,
            # no functions worker, no stream storage (also passed on the command line)
            "functionsWorkerEnabled": False,
            "enablePackagesManagement": False,
            "webSocketServiceEnabled": False,
            "transactionCoordinatorEnabled": False,
            # what this project's tests need
            "acknowledgmentAtBatchIndexLevelEnabled": True,
            "delayedDeliveryEnabled": True,
            # deliver_after/deliver_at to ~0.1 s: by default a delay that ends within the next
            # 1 s tick is delivered at once (non-strict), e.g. deliver_after=1s arrives at 0.03 s
            "isDelayedDeliveryDeliverAtTimeStrict": True,
            "delayedDeliveryTickTimeMillis": 100,
            "allowAutoTopicCreation": True,
            "allowAutoTopicCreationType": "non-partitioned",
            # one bookie
            "managedLedgerDefaultEnsembleSize": 1,
            "managedLedgerDefaultWriteQuorum": 1,
            "managedLedgerDefaultAckQuorum": 1,
            "journalSyncData": False,  # written, not fsynced: survives SIGKILL, not power loss
            "dbStorage_writeCacheMaxSizeMb": 32,
            "dbStorage_readAheadCacheMaxSizeMb": 32,
            "managedLedgerCacheSizeMB": 64,
            # stop in ~3 s instead of ~7 s (netty quiet periods scale with this)
            "brokerShutdownTimeoutMs": 5000,
        }
        merged.update(self.settings)
        merged.update(
            {
                # every listener on loopback, on our ports
                "bindAddress": LOOPBACK,
                "advertisedAddress": LOOPBACK,
                "brokerServicePort": self.port,
                "webServicePort": self.web_port,
                # the bookie reads the same file: bind it to the loopback interface, on our port
                "bookiePort": self.bookie_port,
                "allowEphemeralPorts": True,
                "listeningInterface": _loopback_interface(),
                "allowLoopback": True,
                "httpServerEnabled": False,
            }
        )
        for key in ("brokerServicePortTls", "webServicePortTls", "bindAddresses", "advertisedListeners"):
            merged.pop(key, None)
        return merged

    def _prepare(self) -> None:
        self._classpath = _resolve_classpath(self.maven_project, self.maven_timeout)
        conf_dir = self.data_dir / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "tmp").mkdir(exist_ok=True)
        lines = ["# written by pulsar_nack.broker.PulsarStandalone"]
        for key, value in self._settings().items():
            if not re.fullmatch(r"[A-Za-z0-9_.\-]+", key):
                raise ValueError(f"unsupported broker setting name {key!r}")
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            if "\n" in text or "\r" in text:
                raise ValueError(f"broker setting {key} has a line break")
            lines.append(f"{key}={text.replace(chr(92), chr(92) * 2)}")
        self.config_path.write_text("\n".join(lines) + "\n")
        (conf_dir / "log4j2.xml").write_text(_LOG4J2_XML.format(level=self.log_level.upper()))

    def _command(self) -> list[str]:
        java = _java_binary()
        if java is None:
            raise BrokerError(java_available()[1])
        if self._classpath is None:
            self._classpath = _resolve_classpath(self.maven_project, self.maven_timeout)
        data = self.data_dir
        jvm = [
            java,
            f"-Xms{self.heap_mb}m",
            f"-Xmx{self.heap_mb}m",
            f"-XX:MaxDirectMemorySize={self.direct_memory_mb}m",
            "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError",
            *(["-XX:TieredStopAtLevel=1"] if self.c1_only else []),
            *_JVM_MODULE_OPTIONS,
            "-Dio.netty.tryReflectionSetAccessible=true",
            "-Djava.net.preferIPv4Stack=true",
            "-Dpulsar.allocator.exit_on_oom=true",
            # RocksDB extracts its native library into java.io.tmpdir: keep it in our data dir
            f"-Djava.io.tmpdir={data / 'tmp'}",
            f"-Dlog4j2.configurationFile={data / 'conf' / 'log4j2.xml'}",
            *self.jvm_options,
        ]
        return [
            *jvm,
            "-cp",
            self._classpath,
            self.main_class,
            "--config",
            str(self.config_path),
            "--no-functions-worker",
            "--no-stream-storage",
            "--advertised-address",
            LOOPBACK,
            "--metadata-dir",
            str(data / "metadata"),
            "--bookkeeper-dir",
            str(data / "bookkeeper"),
            "--bookkeeper-port",
            str(self.bookie_port),
            # must not exist: its presence switches standalone to ZooKeeper mode
            "--zookeeper-dir",
            str(data / "zookeeper"),
        ]

    def _ready(self) -> bool:
        """The admin API answers, lists our cluster and the public/default namespace exists."""
        try:
            clusters = self.admin("GET", "/admin/v2/clusters", timeout=2.0)
            if self.cluster_name not in (clusters or []):
                return False
            namespaces = self.admin("GET", "/admin/v2/namespaces/public", timeout=2.0)
        except BrokerError:
            return False
        return "public/default" in (namespaces or []) and _port_accepts(self.port)

    def classpath_digest(self) -> str:
        """Short digest of the resolved classpath (identifies the exact Pulsar build)."""
        cp = self._classpath or _resolve_classpath(self.maven_project, self.maven_timeout)
        return hashlib.sha1(cp.encode()).hexdigest()[:12]


def _topic_path(topic: str) -> str:
    """``persistent://t/ns/x`` or ``x`` -> ``persistent/t/ns/x`` (URL-quoted) for the admin API."""
    if "://" in topic:
        domain, rest = topic.split("://", 1)
    else:
        domain, rest = "persistent", topic
    parts = rest.split("/")
    if len(parts) == 1:
        parts = ["public", "default", parts[0]]
    if len(parts) != 3 or not all(parts) or domain not in ("persistent", "non-persistent"):
        raise ValueError(f"not a topic name: {topic!r}")
    return "/".join([domain, *(urllib.parse.quote(p, safe="") for p in parts)])


# ---------------------------------------------------------------------------------------------
# entry point


def start_broker(kind: Literal["lite", "apache"] = "lite", **options: Any) -> Broker:
    """Start a broker and return it (use it as a context manager to stop it).

    ``kind="lite"`` gives a :class:`PulsarLite`, ``kind="apache"`` a :class:`PulsarStandalone`;
    ``options`` go to the class's constructor.
    """
    broker: Broker
    if kind == "lite":
        broker = PulsarLite(**options)
    elif kind == "apache":
        broker = PulsarStandalone(**options)
    else:
        raise ValueError(f"unknown broker kind {kind!r}: use 'lite' or 'apache'")
    return broker.start()


@contextlib.contextmanager
def broker_url(service_url: str | None = None) -> Iterator[str]:
    """``service_url`` if given, else the URL of an embedded pulsar-lite started for the ``with`` block.

    What the demo and the examples do with their ``--service-url`` option.
    """
    if service_url is not None:
        yield service_url
        return
    with PulsarLite() as broker:
        print(f"started an embedded pulsar-lite broker at {broker.service_url}", flush=True)
        yield broker.service_url
