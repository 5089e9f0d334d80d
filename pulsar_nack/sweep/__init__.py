"""The memory sweep (extra ``spark``): the analysis of the TimeBucket index's memory over a grid of workloads.

Never imported by the SDK, and importing it never imports the Pulsar client, so Spark workers need only
numpy, pyroaring and sortedcontainers. One module per concept:

* :mod:`~pulsar_nack.sweep.grid` — :class:`~pulsar_nack.sweep.grid.GridPoint` and grids of points;
* :mod:`~pulsar_nack.sweep.measure` — one point measured (the Spark task) and PIP-393's theory;
* :mod:`~pulsar_nack.sweep.workloads`, :mod:`~pulsar_nack.sweep.baselines` — the blog's workload
  generator; the designs PIP-393 replaced;
* :mod:`~pulsar_nack.sweep.spark` — the Spark session and job (``pulsar-nack sweep``);
* :mod:`~pulsar_nack.sweep.plots`, :mod:`~pulsar_nack.sweep.report` — the plots and the report;
* :mod:`~pulsar_nack.sweep.java_results` — the Java PIP-393 structure's figures, read from the results
  file of ``bench/index_memory.py`` (the report's Java bars; none without the file).
"""
