"""batchcast's tools beside the data path: measuring runs and comparing them.

- :mod:`.metrics`: track a process (``metrics.track()``), read and combine run directories.
- :mod:`.track`: ``batchcast track`` (a command measured, its runs kept in an MLflow store).
- :mod:`.report`: ``batchcast report`` (shared against baseline, as text, CSV or HTML).
- :mod:`.mlflow_store`: the MLflow file store that track writes and report reads.
- :mod:`.bench`: ``batchcast bench`` (collocated trainers, shared against their own loaders).

Nothing here is imported by ``import batchcast``.
"""
