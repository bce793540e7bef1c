"""Writing and reading runs in MLflow's file-store layout, without MLflow installed.

``mlflow ui --backend-store-uri DIR/mlruns`` (MLflow 3.13 and later also want
``MLFLOW_ALLOW_FILE_STORE=true`` in the environment, as the file store is deprecated there)
shows what ``batchcast track`` recorded. The layout, as MLflow's ``FileStore`` writes it::

    mlruns/
      0/meta.yaml                     the "Default" experiment, created with the store
      <experiment_id>/meta.yaml       experiment_id, name, artifact_location, lifecycle_stage,
                                      creation_time, last_update_time
      <experiment_id>/<run_id>/
        meta.yaml                     run_id, run_uuid, run_name, experiment_id, user_id,
                                      status (1 RUNNING, 3 FINISHED, 4 FAILED, 5 KILLED),
                                      start_time, end_time (ms), artifact_uri,
                                      lifecycle_stage, source_type (4 LOCAL), tags: []
        metrics/<key>                 lines "timestamp_ms value step"; a "/" in a key is a
                                      subdirectory (system/cpu_utilization_percentage)
        params/<key>, tags/<key>      the value, as the whole file
        artifacts/

Nested runs are ordinary runs with the tag ``mlflow.parentRunId``. Identifiers are 32 hex digit
run ids and decimal experiment ids, as MLflow makes them. Several ``batchcast track`` processes
may write one store at once: creating an experiment or a workload's parent run happens under an
exclusive lock on ``mlruns/.batchcast.lock``. meta.yaml is written without PyYAML (flat mappings
of quoted strings and integers, which any YAML reader parses).

Thread-safety: functions are independent; a :class:`RunWriter` belongs to one thread.
"""

from __future__ import annotations

import fcntl
import getpass
import os
import threading
import re
import time
import uuid
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["Store", "RunWriter", "read_run", "RUNNING", "FINISHED", "FAILED", "KILLED"]

RUNNING, FINISHED, FAILED, KILLED = 1, 3, 4, 5
_LOCAL = 4  # SourceType.LOCAL

Scalar = Union[str, int, float]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list) and not v:
        return "[]"
    if v is None:
        return "null"
    return "'" + str(v).replace("'", "''") + "'"


def _write_yaml(path: str, data: Mapping[str, Any]) -> None:
    # A temporary name of this writer's own: collocated trackers end one parent run at once,
    # and a shared name made one's rename take the other's file from under it.
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        for k in sorted(data):
            f.write(f"{k}: {_yaml_scalar(data[k])}\n")
    os.replace(tmp, path)


def _read_yaml(path: str) -> Dict[str, Any]:
    """Reads the flat meta.yaml files of this layout (ours or MLflow's): ``key: value`` lines,
    values quoted ('' escapes ') or bare (integers, [] and null)."""
    out: Dict[str, Any] = {}
    with open(path) as f:
        for line in f:
            if ":" not in line or line.startswith((" ", "-", "#")):
                continue
            key, _, raw = line.partition(":")
            raw = raw.strip()
            if raw.startswith("'") and raw.endswith("'") and len(raw) >= 2:
                out[key] = raw[1:-1].replace("''", "'")
            elif raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
                out[key] = raw[1:-1]
            elif re.fullmatch(r"-?\d+", raw):
                out[key] = int(raw)
            elif raw in ("[]", ""):
                out[key] = [] if raw == "[]" else ""
            elif raw == "null":
                out[key] = None
            else:
                out[key] = raw
    return out


def _safe_key(key: str) -> str:
    # MLflow's rule for metric/param/tag names: alphanumerics, _ - . space / ; no "..", no
    # leading "/". Anything else becomes "_" so a user's parameter name never escapes the run.
    key = re.sub(r"[^A-Za-z0-9_\-. /]", "_", key).strip("/")
    return key.replace("..", "_") or "_"


class Store:
    """An MLflow file store rooted at ``root`` (its ``mlruns`` directory), created if needed."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(os.path.join(self.root, ".trash"), exist_ok=True)
        with self._locked():
            if not os.path.isfile(os.path.join(self.root, "0", "meta.yaml")):
                self._create_experiment("0", "Default")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(os.path.join(self.root, ".batchcast.lock"), "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _create_experiment(self, exp_id: str, name: str) -> None:
        d = os.path.join(self.root, exp_id)
        os.makedirs(d, exist_ok=True)
        now = _now_ms()
        _write_yaml(os.path.join(d, "meta.yaml"), {
            "experiment_id": exp_id, "name": name, "lifecycle_stage": "active",
            "artifact_location": "file://" + d, "creation_time": now, "last_update_time": now,
        })

    def experiments(self) -> Dict[str, str]:
        """name -> experiment id."""
        out = {}
        for entry in os.listdir(self.root):
            meta = os.path.join(self.root, entry, "meta.yaml")
            if entry.isdigit() and os.path.isfile(meta):
                out[str(_read_yaml(meta).get("name"))] = entry
        return out

    def experiment_id(self, name: str) -> str:
        """The id of experiment ``name``, created if missing."""
        with self._locked():
            known = self.experiments()
            if name in known:
                return known[name]
            new_id = str(max((int(i) for i in known.values()), default=0) + 1)
            self._create_experiment(new_id, name)
            return new_id

    def runs(self, exp_id: str) -> List[str]:
        d = os.path.join(self.root, exp_id)
        return sorted(e for e in os.listdir(d)
                      if os.path.isfile(os.path.join(d, e, "meta.yaml")) and re.fullmatch(r"[0-9a-f]{32}", e))

    def parent_run(self, exp_id: str, workload: str) -> "RunWriter":
        """The parent run grouping workload ``workload`` (tag batchcast.workload, no parent),
        created RUNNING if missing; several tracked commands share it."""
        with self._locked():
            for run_id in self.runs(exp_id):
                tags = os.path.join(self.root, exp_id, run_id, "tags")
                try:
                    with open(os.path.join(tags, "batchcast.workload")) as f:
                        is_w = f.read() == workload
                except OSError:
                    continue
                if is_w and not os.path.exists(os.path.join(tags, "mlflow.parentRunId")):
                    return RunWriter(self, exp_id, run_id)
            return self.create_run(exp_id, workload, {"batchcast.workload": workload})

    def create_run(self, exp_id: str, name: str, tags: Mapping[str, str],
                   parent: Optional["RunWriter"] = None) -> "RunWriter":
        run_id = uuid.uuid4().hex
        d = os.path.join(self.root, exp_id, run_id)
        for sub in ("metrics", "params", "tags", "artifacts"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        user = getpass.getuser()
        _write_yaml(os.path.join(d, "meta.yaml"), {
            "run_id": run_id, "run_uuid": run_id, "run_name": name, "experiment_id": exp_id,
            "user_id": user, "status": RUNNING, "start_time": _now_ms(), "end_time": None,
            "artifact_uri": "file://" + os.path.join(d, "artifacts"), "lifecycle_stage": "active",
            "source_type": _LOCAL, "source_name": "", "entry_point_name": "", "source_version": "",
            "tags": [],
        })
        run = RunWriter(self, exp_id, run_id)
        run.set_tags({"mlflow.runName": name, "mlflow.user": user,
                      "mlflow.source.type": "LOCAL", **tags})
        if parent is not None:
            run.set_tags({"mlflow.parentRunId": parent.run_id})
        return run


class RunWriter:
    """One run of a :class:`Store`: params, tags, metrics, and its end status."""

    def __init__(self, store: Store, exp_id: str, run_id: str) -> None:
        self.store, self.experiment_id, self.run_id = store, exp_id, run_id
        self.dir = os.path.join(store.root, exp_id, run_id)

    def _write(self, kind: str, key: str, text: str, append: bool = False) -> None:
        path = os.path.join(self.dir, kind, _safe_key(key))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a" if append else "w") as f:
            f.write(text)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for k, v in tags.items():
            self._write("tags", k, str(v))

    def log_params(self, params: Mapping[str, Any]) -> None:
        for k, v in params.items():
            self._write("params", k, str(v))

    def log_metric(self, key: str, points: Sequence[Tuple[int, float, int]]) -> None:
        """Appends (timestamp_ms, value, step) points; NaN and None values are skipped."""
        lines = "".join(f"{int(t)} {float(v)!r} {int(s)}\n" for t, v, s in points
                        if v is not None and v == v)
        if lines:
            self._write("metrics", key, lines, append=True)

    def end(self, status: int) -> None:
        meta_path = os.path.join(self.dir, "meta.yaml")
        meta = _read_yaml(meta_path)
        meta.update(status=status, end_time=_now_ms())
        _write_yaml(meta_path, meta)


def read_run(run_dir: str) -> Dict[str, Any]:
    """A run directory of the layout as ``{"meta", "params", "tags", "metrics"}``; ``metrics``
    maps each key to its [(timestamp_ms, value, step)] points."""
    out: Dict[str, Any] = {"meta": _read_yaml(os.path.join(run_dir, "meta.yaml")),
                           "params": {}, "tags": {}, "metrics": {}}
    for kind in ("params", "tags", "metrics"):
        base = os.path.join(run_dir, kind)
        for dirpath, _, files in os.walk(base):
            for name in files:
                path = os.path.join(dirpath, name)
                key = os.path.relpath(path, base).replace(os.sep, "/")
                with open(path) as f:
                    text = f.read()
                if kind != "metrics":
                    out[kind][key] = text
                    continue
                points = []
                for line in text.splitlines():
                    t, v, s = line.split()
                    points.append((int(t), float(v), int(s)))
                out["metrics"][key] = points
    return out
