"""Shared fixtures: the two real brokers (pulsar-lite and Apache Pulsar standalone), topics, clients.

* ``pulsar_lite`` -- session-scoped, started :class:`~pulsar_nack.testing.PulsarLite`.
* ``apache_pulsar`` -- session-scoped, started :class:`~harness.standalone.PulsarStandalone`
  (started once, on first use; the first run ever resolves Apache Pulsar with Maven).
* ``broker`` -- parametrized over both (ids ``lite`` and ``apache``). Mark a test
  ``@pytest.mark.apache_only`` or ``@pytest.mark.lite_only`` to run it against one of them only.
* ``unique_topic`` -- ``persistent://public/default/t-<uuid>``; ``pulsar_client`` -- a
  ``pulsar.Client`` on ``broker``, closed after the test.

Without Java 17+ (or without Maven before the first resolution) the tests that need Apache Pulsar
are skipped, and the terminal summary says so in a section of its own. With
``PULSAR_NACK_REQUIRE_APACHE=1`` (set on CI) they fail instead.

The sweep's ``spark`` and ``spark_rows`` come from ``spark_fixtures.py``, loaded as a plugin.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

import pulsar_nack
from harness.maven import apache_pulsar_available
from harness.standalone import PulsarStandalone
from pulsar_nack.testing import Broker, PulsarLite

# The sweep's fixtures (``spark``, ``spark_rows``), defined once for the session.
pytest_plugins = ["spark_fixtures"]

BROKER_KINDS = ("lite", "apache")
_SKIP_PREFIX = "Apache Pulsar unavailable"
_REQUIRE_ENV = "PULSAR_NACK_REQUIRE_APACHE"

# (nodeid, reason) of every test skipped because Apache Pulsar could not run here
_apache_skips: list[tuple[str, str]] = []


def _require_apache() -> bool:
    return os.environ.get(_REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _deselects_apache(config: pytest.Config) -> bool:
    """Whether the run's ``-m`` expression deselects a test marked ``apache`` and nothing else."""
    markexpr = config.getoption("markexpr", "") or ""
    if not markexpr:
        return False
    from _pytest.mark.expression import Expression  # (pytest's own -m parser: no public API for it)

    def only_apache(name: str, /, **_: str | int | bool | None) -> bool:
        return name == "apache"

    return not Expression.compile(markexpr).evaluate(only_apache)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "apache_only: run only against Apache Pulsar (with the `broker` fixture: only its "
        "'apache' parameter)",
    )
    config.addinivalue_line(
        "markers",
        "lite_only: run only against pulsar-lite (with the `broker` fixture: only its 'lite' parameter)",
    )
    config.addinivalue_line(
        "markers",
        "apache: needs the Apache Pulsar standalone (Java + Maven); added automatically, "
        "deselect with -m 'not apache'",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "broker" not in metafunc.fixturenames:
        return
    apache_only = metafunc.definition.get_closest_marker("apache_only") is not None
    lite_only = metafunc.definition.get_closest_marker("lite_only") is not None
    if apache_only and lite_only:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: both apache_only and lite_only")
    kinds = ["apache"] if apache_only else ["lite"] if lite_only else list(BROKER_KINDS)
    metafunc.parametrize("broker", kinds, indirect=True, ids=kinds)


def needs_apache(item: pytest.Item) -> bool:
    """Whether ``item`` runs against Apache Pulsar, as collection can tell: it asks for ``apache_pulsar`` or
    ``require_apache``, or any of its parameters — ``broker``'s, or a test's own ``kind`` that picks its
    broker with ``request.getfixturevalue`` — is ``"apache"``. (A test that fetches the broker some other way
    is caught when it runs: :func:`require_apache` fails under a marker expression that deselects Apache.)"""
    fixtures = getattr(item, "fixturenames", ())
    if "apache_pulsar" in fixtures or "require_apache" in fixtures:
        return True
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return any(isinstance(value, str) and value == "apache" for value in params)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if needs_apache(item):
            item.add_marker(pytest.mark.apache)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if _SKIP_PREFIX in reason:
            _apache_skips.append((report.nodeid, reason.removeprefix("Skipped: ")))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _apache_skips:
        return
    tr = terminalreporter
    tr.section(
        f"{len(_apache_skips)} TESTS SKIPPED: NO APACHE PULSAR (Java/Maven missing)",
        sep="!",
        red=True,
        bold=True,
    )
    reasons = sorted({reason for _, reason in _apache_skips})
    for reason in reasons:
        tr.write_line(f"why: {reason}", red=True, bold=True)
    for nodeid, _ in _apache_skips:
        tr.write_line(f"  skipped: {nodeid}", yellow=True)
    tr.write_line(
        "These tests ran against pulsar-lite only (or not at all). Install Java 17+ and Maven "
        f"to run them; set {_REQUIRE_ENV}=1 to make this a failure.",
        red=True,
        bold=True,
    )


@pytest.fixture(scope="session")
def pulsar_lite() -> Iterator[PulsarLite]:
    """A pulsar-lite broker for the whole session (temp data dir, loopback ports)."""
    with PulsarLite() as broker:
        yield broker


@pytest.fixture(scope="session")
def require_apache(request: pytest.FixtureRequest) -> None:
    """Skip the test (fail it with PULSAR_NACK_REQUIRE_APACHE=1) if Apache Pulsar cannot run.

    For tests that start their own :class:`PulsarStandalone`; ``apache_pulsar`` uses it too. Fails a test
    that reaches it in a run whose ``-m`` deselects Apache tests: collection did not see that it needs
    Apache (:func:`needs_apache`), so ``-m 'not apache'`` would start a broker it promised not to.
    """
    if _deselects_apache(request.config):
        pytest.fail(
            "this test uses Apache Pulsar but was not marked `apache` at collection: ask for the "
            "`apache_pulsar`/`require_apache` fixture or take a parameter 'apache' (see needs_apache)",
            pytrace=False,
        )
    ok, reason = apache_pulsar_available()
    if not ok:
        message = f"{_SKIP_PREFIX}: {reason}"
        if _require_apache():
            pytest.fail(f"{message} ({_REQUIRE_ENV}=1)", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def apache_pulsar(require_apache: None) -> Iterator[PulsarStandalone]:
    """An Apache Pulsar standalone for the whole session, started once on first use.

    Skipped (fails with PULSAR_NACK_REQUIRE_APACHE=1) if Java or Maven is missing; any other
    start failure is an error.
    """
    broker = PulsarStandalone(settings={"delayedDeliveryMaxDelayInMillis": 3_600_000})
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Broker:
    """The session broker of the kind in ``request.param`` ('lite' or 'apache')."""
    kind = request.param
    if kind == "lite":
        lite: PulsarLite = request.getfixturevalue("pulsar_lite")
        return lite
    if kind == "apache":
        apache: PulsarStandalone = request.getfixturevalue("apache_pulsar")
        return apache
    raise ValueError(f"unknown broker kind {kind!r}")


@pytest.fixture
def unique_topic() -> str:
    """A fresh topic name, ``persistent://public/default/t-<uuid>`` (auto-created on use)."""
    return f"persistent://public/default/t-{uuid.uuid4().hex}"


def _client_on(broker: Broker, client_type: Any) -> Iterator[Any]:
    """A client of ``client_type`` on ``broker`` (client logs at WARN), closed afterwards."""
    import pulsar

    client = client_type(
        broker.service_url,
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def pulsar_client(broker: Broker) -> Iterator[Any]:
    """A ``pulsar.Client`` on ``broker``, closed after the test."""
    import pulsar

    yield from _client_on(broker, pulsar.Client)


@pytest.fixture
def nack_client(broker: Broker) -> Iterator[Any]:
    """A ``pulsar_nack.Client`` on ``broker``, closed after the test."""
    import pulsar_nack

    yield from _client_on(broker, pulsar_nack.Client)


@pytest.fixture(scope="module")
def offline_client() -> Iterator[pulsar_nack.Client]:
    """A pulsar_nack.Client on a closed port: for every check that runs before anything is sent."""
    client = pulsar_nack.Client(
        "pulsar://127.0.0.1:9",
        operation_timeout_seconds=1,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def lite_client(pulsar_lite: PulsarLite) -> Iterator[pulsar_nack.Client]:
    """A pulsar_nack.Client on the session's pulsar-lite broker, shared by a module's tests."""
    client = pulsar_nack.Client(
        pulsar_lite.service_url,
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )
    yield client
    client.close()
