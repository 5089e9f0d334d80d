"""The repository's test and benchmark harness (not shipped in the wheel): Apache Pulsar standalone.

* :mod:`harness.maven` — Java and Maven discovery, Apache Pulsar's classpath resolved with Maven from the
  project in ``harness/broker/``;
* :mod:`harness.standalone` — :class:`~harness.standalone.PulsarStandalone` (with its admin REST client)
  and :func:`~harness.standalone.start_broker` for either broker.

The embedded pulsar-lite broker they share a life cycle with is shipped: :mod:`pulsar_nack.testing`.
Importable from the repository root (pytest's ``pythonpath``; the bench scripts add the root themselves).
"""
