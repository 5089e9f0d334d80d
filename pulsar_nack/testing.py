"""An embedded Pulsar broker for the demo, the examples and tests (extra ``broker``: pulsar-lite).

:class:`PulsarLite` runs the pulsar-lite binary shipped inside the ``pulsar-lite`` wheel as one local
process. It starts in milliseconds; it does not implement everything Apache Pulsar does (no delayed
delivery, no nack redelivery on partitioned topics, ...). :func:`broker_url` is what the demo and the
examples do with their ``--service-url`` option::

    from pulsar_nack.testing import PulsarLite, broker_url

    with broker_url(None) as service_url:         # starts a pulsar-lite for the block
        client = pulsar.Client(service_url)
        ...
    with PulsarLite() as broker:                  # or the broker object itself
        client = pulsar.Client(broker.service_url)

:class:`Broker` is the life cycle a local broker process shares with other brokers (the repository's
test harness runs Apache Pulsar standalone on it). Every listener is bound to 127.0.0.1 on a free port.
Processes are started directly (the PID we hold is the broker itself, never a wrapper shell), stopped by
that PID (SIGTERM, then SIGKILL after a timeout) and never by name. Data lives in a temporary directory
that :meth:`Broker.stop` removes, unless the caller passed its own ``data_dir``. :meth:`Broker.restart`
keeps ports and data, so unacknowledged messages survive it; :meth:`Broker.kill` simulates a crash
(SIGKILL) and a later :meth:`Broker.start` recovers from the same data.
"""

from __future__ import annotations

import atexit
import contextlib
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
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Self

__all__ = [
    "LOOPBACK",
    "Broker",
    "BrokerError",
    "PulsarLite",
    "SettingValue",
    "broker_url",
    "file_tail",
    "free_ports",
    "port_accepts",
]

_log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"

#: A broker setting value: written as ``true``/``false`` for booleans, ``str()`` otherwise.
SettingValue = str | int | float | bool


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


def port_accepts(port: int, timeout: float = 0.25) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout):
            return True
    except OSError:
        return False


def file_tail(path: Path, lines: int = 40) -> str:
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


# the shared process life cycle

_LIVE: weakref.WeakSet[Broker] = weakref.WeakSet()


_OWNER_FILE = ".pulsar-nack-owner.json"
_TEMP_PREFIX = "pulsar-nack-"
_swept: set[str] = set()


def _sweep_stale_temp_dirs(kind: str) -> None:
    """Remove temp data dirs of ``kind`` brokers whose starter and broker processes are both gone.

    A test run killed with SIGKILL/SIGTERM cannot clean up after itself; its broker dies with it
    (``die_with_parent``) and the next run removes the directory here. Directories without an
    owner file, kept on purpose (``keep_data_dir``) or with a live PID are left alone.
    """
    if kind in _swept:
        return
    _swept.add(kind)
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
        return file_tail(self.log_path, lines)

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
                _sweep_stale_temp_dirs(self.kind)
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
            "# written by pulsar_nack.testing.PulsarLite",
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
        return port_accepts(self.port)


# ---------------------------------------------------------------------------------------------
# Apache Pulsar standalone

# ---------------------------------------------------------------------------------------------
# entry point


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
