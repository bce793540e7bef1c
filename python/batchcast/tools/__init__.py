"""batchcast's tools beside the data path: measuring runs and comparing them.

- :mod:`.metrics`: track a process (``metrics.track()``, from ``batchcast._tracking``), read and
  combine run directories, each figure counted once.
- :mod:`.track`: ``batchcast track`` (a command measured, its runs kept in an MLflow store);
  :mod:`.experiment_file`: its ``--file`` experiments.
- :mod:`.report`: ``batchcast report`` (shared against baseline, as text, CSV or HTML);
  :mod:`.report_tables`: its page's tables.
- :mod:`.mlflow_store`: the MLflow file store that track writes and report reads.
- :mod:`.bench`: ``batchcast bench`` (collocated trainers, shared against their own loaders).

Nothing here is imported by ``import batchcast``.
"""
