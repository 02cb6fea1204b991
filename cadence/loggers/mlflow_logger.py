"""The :class:`MLFlowLogger`: params, metrics and the run's end status to MLflow.

Source: MosaicML Composer's ``MLFlowLogger`` (``composer/loggers/mlflow_logger.py``): its
arguments and environment variables (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``). It writes through an ``MlflowClient`` (no global active run),
and ends the run ``FAILED`` when training fails, where Composer always ends it
``FINISHED``. Needs ``mlflow`` (``pip install 'cadence[mlflow]'``).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from cadence.loggers.logger_destination import to_python
from cadence.loggers.tracker_destination import TrackerDestination, flatten_hyperparameters
from cadence.registry import loggers

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["MLFlowLogger", "DEFAULT_EXPERIMENT_NAME", "DEFAULT_TRACKING_URI"]

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT_NAME = "cadence"
"""The experiment runs go to when neither ``experiment_name`` nor ``MLFLOW_EXPERIMENT_NAME``
names one."""

DEFAULT_TRACKING_URI = "sqlite:///runs/mlflow.db"
"""The local store used when neither ``tracking_uri`` nor ``MLFLOW_TRACKING_URI`` is set: one
SQLite file next to the runs' folders, shared by every run started in this directory
(MLflow 3 refuses its older ``./mlruns`` file store by default). Browse it with
``mlflow ui --backend-store-uri sqlite:///runs/mlflow.db``."""

_MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value (longer ones are truncated)
_MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
_MAX_PARAMS_PER_BATCH = 100


def _local_default_uri() -> str:
    """:data:`DEFAULT_TRACKING_URI` with an absolute path: MLflow caches one store per URI
    string, so a relative path would keep writing into the first working directory's file."""
    return "sqlite:///" + str((Path("runs") / "mlflow.db").resolve())


def _client(tracking_uri: str, registry_uri: Optional[str] = None) -> Any:
    """An ``MlflowClient`` on ``tracking_uri`` (creating a SQLite store's folder).

    Importing MLflow's SQL store triggers SQLAlchemy 2.1's "The ``noload`` loader strategy
    is deprecated" DeprecationWarning (from MLflow's own table mappings, not from cadence);
    it is silenced here, where it fires, so runs with warnings as errors can use MLflow.
    """
    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The ``noload`` loader strategy",
                                category=DeprecationWarning)
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri, registry_uri)


@loggers.register("mlflow")
class MLFlowLogger(TrackerDestination):
    """Logs the run's config as MLflow params, its metrics with their ``step``, and ends the
    MLflow run ``FINISHED`` or ``FAILED``.

    At ``AFTER_LOAD`` it opens the tracking store, creates the experiment if it does not exist
    and starts a new MLflow run named after the cadence run, tagged ``cadence_run_name``. The
    MLflow run id is kept in every checkpoint: a run that resumes a checkpoint of the same
    ``run_name`` (autoresume) continues that MLflow run (status ``RUNNING`` again, tag
    ``cadence_resumed_at`` = the steps it resumed from) instead of starting another; if the
    store no longer has it, a new run is started. MLflow keeps every value logged: after a
    hard kill, a step the killed attempt logged past its last checkpoint has two values
    (the later one is the resumed run's).
    Hyperparameters (the Trainer's ``hyperparameters``: the YAML config and the seed) are
    flattened to dotted keys (``optimizer.lr``) and logged as params; a param logged again
    with another value is kept as first logged (MLflow params are immutable) and reported
    in the log. Metrics are logged at ``step`` (the optimizer step), buffered and sent in
    batches every ``flush_interval`` seconds, at ``EVAL_END`` and ``FIT_END``, and at close;
    values that are not numbers are skipped.

    :meth:`close` (the Trainer's ``close()``, also run at interpreter exit) sends what is
    buffered and ends the run: ``FAILED`` when a ``fit`` started and did not reach
    ``FIT_END`` (an exception, or ``KeyboardInterrupt``), or when an exception is being
    handled as it closes; otherwise ``FINISHED``. Safe to call twice.

    Args:
        experiment_name: the MLflow experiment; default ``MLFLOW_EXPERIMENT_NAME``, else
            ``"cadence"``.
        run_name: the MLflow run's name; default the cadence run name. With
            ``rank_zero_only=False`` and several ranks, ``-rank{r}`` is appended.
        tags: more tags for the MLflow run.
        tracking_uri: where runs are stored (``sqlite:///path.db``, ``http://host:5000``,
            ``databricks``); default ``MLFLOW_TRACKING_URI``, else
            :data:`DEFAULT_TRACKING_URI` (``sqlite:///runs/mlflow.db``).
        rank_zero_only: log on global rank zero only (default); else every rank starts its
            own MLflow run.
        flush_interval: seconds between sends of buffered metrics (default 10, as Composer).
        model_registry_prefix: prefix of the names :meth:`register_model` registers under
            (``{catalog}.{schema}`` for Unity Catalog); default ``""``.
        model_registry_uri: the model registry (``databricks-uc`` for Unity Catalog); default
            the tracking store.
        synchronous: send each batch and wait for it (default ``True``), or hand it to
            MLflow's asynchronous queue, drained at ``close`` (``False``, Composer's default:
            a killed process loses what is queued, so cadence waits; the batches are already
            buffered for ``flush_interval`` seconds).
        log_system_metrics: run MLflow's system-metrics monitor (CPU, memory, disk, network,
            GPU with ``pynvml``) for the run, sampling every 5 s and logging every 30 s;
            default ``True``, as Composer. Needs ``psutil``.
        rename_metrics: ``{name: new name}``, exact names; default none.
        ignore_metrics: glob patterns (``fnmatch``) of metric names not logged.
        ignore_hyperparameters: glob patterns of (flattened) param names not logged.
        run_group: tagged on the run as ``run_group``.
        resume: without a checkpoint's run id, continue the newest MLflow run of this
            experiment tagged with this cadence run name instead of starting one (default
            ``False``). Resuming a checkpoint always continues its MLflow run.
        logging_buffer_seconds: with ``synchronous=False``, MLflow's async buffer
            (``MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS``); default 10; ``None`` leaves it.
        log_duplicated_metric_every_n_steps: a metric whose value equals the last one logged
            is skipped until this many steps passed since that one (default 100, as
            Composer); 0 logs every value.

    Raises:
        ImportError: ``mlflow`` is not installed, naming ``pip install mlflow``.
        ValueError: ``flush_interval`` is negative; a Unity Catalog ``model_registry_prefix``
            that is not ``catalog.schema``; a negative ``log_duplicated_metric_every_n_steps``.

    Example (YAML)::

        loggers:
          mlflow: {experiment_name: shakespeare}
    """

    package = "mlflow"
    keeps_run_id = True

    def __init__(
        self,
        experiment_name: Optional[str] = None,
        run_name: Optional[str] = None,
        tags: Optional[Mapping[str, Any]] = None,
        tracking_uri: Optional[str] = None,
        rank_zero_only: bool = True,
        flush_interval: float = 10.0,
        model_registry_prefix: str = "",
        model_registry_uri: Optional[str] = None,
        synchronous: bool = True,
        log_system_metrics: bool = True,
        rename_metrics: Optional[dict[str, str]] = None,
        ignore_metrics: Optional[Sequence[str]] = None,
        ignore_hyperparameters: Optional[Sequence[str]] = None,
        run_group: Optional[str] = None,
        resume: bool = False,
        logging_buffer_seconds: Optional[int] = 10,
        log_duplicated_metric_every_n_steps: int = 100,
    ) -> None:
        super().__init__(rank_zero_only)
        if model_registry_uri == "databricks-uc" and len(model_registry_prefix.split(".")) != 2:
            raise ValueError(f"MLFlowLogger: with model_registry_uri='databricks-uc', "
                             f"model_registry_prefix must be '<catalog>.<schema>', got "
                             f"{model_registry_prefix!r}.")
        if isinstance(log_duplicated_metric_every_n_steps, bool) or \
                int(log_duplicated_metric_every_n_steps) < 0:
            raise ValueError(f"MLFlowLogger log_duplicated_metric_every_n_steps must be an int "
                             f">= 0, got {log_duplicated_metric_every_n_steps!r}.")
        self.model_registry_prefix = model_registry_prefix
        self.model_registry_uri = model_registry_uri
        self.synchronous = bool(synchronous)
        self.log_system_metrics = bool(log_system_metrics)
        self.rename_metrics = dict(rename_metrics or {})
        self.ignore_metrics = list(ignore_metrics or [])
        self.ignore_hyperparameters = list(ignore_hyperparameters or [])
        self.run_group = run_group
        self.resume = bool(resume)
        self.logging_buffer_seconds = logging_buffer_seconds
        self.log_duplicated_metric_every_n_steps = int(log_duplicated_metric_every_n_steps)
        self._last_logged: dict[str, tuple[float, int]] = {}  # name -> (value, step)
        self._system_monitor: Any = None
        if isinstance(flush_interval, bool) or not isinstance(flush_interval, (int, float)) \
                or flush_interval < 0:
            raise ValueError(f"MLFlowLogger flush_interval must be a number of seconds >= 0, "
                             f"got {flush_interval!r}.")
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.tracking_uri = tracking_uri
        self.flush_interval = float(flush_interval)
        self.run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self._client: Any = None
        self._closed = False
        self._fit_running = False
        self._params: dict[str, str] = {}  # logged to MLflow
        self._pending_params: dict[str, str] = {}
        self._pending_metrics: list[tuple[dict[str, float], Optional[int], int]] = []
        self._async_operations: list[Any] = []  # synchronous=False: waited for at close
        self._last_flush = time.monotonic()

    # -- the MLflow run -------------------------------------------------------------------
    def _resolved_uri(self) -> str:
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
        return _local_default_uri() if uri == DEFAULT_TRACKING_URI else uri

    def _start(self, state: State) -> None:
        if self._client is not None or self._closed or not self._enabled():
            return
        uri = self._resolved_uri()
        if not self.synchronous and self.logging_buffer_seconds:
            os.environ["MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"] = str(self.logging_buffer_seconds)
        client = _client(uri, self.model_registry_uri)
        name = (self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                or DEFAULT_EXPERIMENT_NAME)
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            self.experiment_id = experiment.experiment_id
        else:
            artifacts = None
            if uri == _local_default_uri():  # keep artifacts beside the store, not in ./mlruns
                artifacts = (Path("runs") / "mlartifacts").resolve().as_uri()
            self.experiment_id = client.create_experiment(name, artifact_location=artifacts)
        run_name = self._rank_name(self.run_name or state.run_name)
        run = self._resumed_run(client)
        if run is None and self.resume:
            run = self._run_by_name(client, state.run_name)
        if run is None:
            group = {"run_group": self.run_group} if self.run_group else {}
            run = client.create_run(self.experiment_id, run_name=run_name,
                                    tags={"cadence_run_name": state.run_name, **group,
                                          **self.tags})
        self._client, self.run_id = client, run.info.run_id
        if self.log_system_metrics:
            self._start_system_metrics(uri)
        log.info("MLflow run %s (%s) in experiment %r at %s%s", run_name, self.run_id, name, uri,
                 f", resumed at step {self.resumed_at}" if run.info.run_id == self.resume_id
                 else "")
        self._flush()

    def _resumed_run(self, client: Any) -> Any:
        """The checkpoint's MLflow run, running again (``None``: a new run, or it is gone)."""
        if self.resume_id is None:
            return None
        try:
            run = client.get_run(self.resume_id)
        except Exception:  # noqa: BLE001 - MlflowException: deleted, or another store
            log.warning("MLflow run %s of the checkpoint is not in the store; starting a new "
                        "run.", self.resume_id)
            return None
        if run.info.experiment_id != self.experiment_id:
            return None
        marks = run.data.tags.get("cadence_resumed_at")
        marks = f"{marks},{self.resumed_at}" if marks else str(self.resumed_at)
        client.set_tag(run.info.run_id, "cadence_resumed_at", marks)
        client.update_run(run.info.run_id, status="RUNNING")
        logged = dict(run.data.params)  # MLflow params are immutable: not sent again
        for key in [k for k in self._pending_params if k in logged]:
            if self._pending_params.pop(key) != logged[key]:
                log.info("MLFlowLogger: param %r keeps the value %r the run logged first.",
                         key, logged[key])
        self._params.update(logged)
        return run

    def _run_by_name(self, client: Any, run_name: str) -> Any:
        """``resume=True``: the newest run of the experiment tagged with ``run_name``, running
        again, or ``None``."""
        runs = client.search_runs([self.experiment_id],
                                  filter_string=f"tags.cadence_run_name = '{run_name}'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        if not runs:
            log.info("MLFlowLogger(resume=True): no MLflow run tagged %r; starting one.", run_name)
            return None
        client.update_run(runs[0].info.run_id, status="RUNNING")
        self._params.update(runs[0].data.params)
        return runs[0]

    def _start_system_metrics(self, uri: str) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
            monitor = SystemMetricsMonitor(self.run_id, sampling_interval=5,
                                           samples_before_logging=6, resume_logging=True,
                                           tracking_uri=uri)
            monitor.start()
        except Exception as error:  # noqa: BLE001 - psutil missing, an unsupported store
            log.warning("MLFlowLogger: system metrics are not logged (%s); pass "
                        "log_system_metrics=False to silence this.", error)
            return
        self._system_monitor = monitor

    def register_model(self, model_uri: str, name: str, await_registration_for: int = 300,
                       tags: Optional[dict[str, Any]] = None) -> Any:
        """Register the model at ``model_uri`` (``runs:/<id>/<path>``, ``models:/...``) as a
        new version of ``{model_registry_prefix}.{name}`` in the registry (Composer's
        ``register_model``); the registered model is created when missing. Rank zero only.

        Returns:
            The ``ModelVersion``, or ``None`` on other ranks.
        """
        if not self._enabled() or self._client is None:
            return None
        full_name = f"{self.model_registry_prefix}.{name}" if self.model_registry_prefix else name
        from mlflow.exceptions import MlflowException

        try:
            self._client.get_registered_model(full_name)
        except MlflowException:
            self._client.create_registered_model(full_name)
        return self._client.create_model_version(full_name, model_uri, run_id=self.run_id,
                                                 tags=tags,
                                                 await_creation_for=await_registration_for)

    def _wait_for_async_logging(self) -> None:
        """Block until every batch handed to MLflow's asynchronous queue is in this logger's
        store. (Not ``mlflow.flush_async_logging()``: that flushes the store of MLflow's global
        tracking URI, which without ``MLFLOW_TRACKING_URI`` creates ``./mlflow.db``.)"""
        operations, self._async_operations = self._async_operations, []
        for operation in operations:
            try:
                operation.wait()
            except Exception as error:  # noqa: BLE001 - MlflowException: the batch is lost
                log.warning("MLFlowLogger: asynchronous logging failed: %s", error)

    def run_id_to_resume(self) -> Optional[str]:
        """The MLflow run id (kept in checkpoints), once the run started."""
        return self.run_id

    def _flush(self) -> None:
        """Send buffered params and metrics (in MLflow's batch sizes)."""
        if self._client is None:
            return
        from mlflow.entities import Metric, Param

        self._last_flush = time.monotonic()
        params = [Param(k, v) for k, v in self._pending_params.items()]
        self._pending_params = {}
        operations = []
        for start in range(0, len(params), _MAX_PARAMS_PER_BATCH):
            operations.append(self._client.log_batch(
                self.run_id, params=params[start:start + _MAX_PARAMS_PER_BATCH],
                synchronous=self.synchronous))
        metrics = [Metric(key, value, millis, step if step is not None else 0)
                   for values, step, millis in self._pending_metrics
                   for key, value in values.items()]
        self._pending_metrics = []
        for start in range(0, len(metrics), _MAX_METRICS_PER_BATCH):
            operations.append(self._client.log_batch(
                self.run_id, metrics=metrics[start:start + _MAX_METRICS_PER_BATCH],
                synchronous=self.synchronous))
        # asynchronous: RunOperations on this logger's own store (None when synchronous)
        self._async_operations.extend(op for op in operations if op is not None)

    # -- LoggerDestination ----------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Buffer the numeric ``metrics`` at ``step``; send when ``flush_interval`` passed."""
        self._start_after_init()
        if not self._enabled() or self._closed:
            return
        values = {}
        at = 0 if step is None else int(step)
        for key, value in metrics.items():
            value, key = to_python(value), str(key)
            if not isinstance(value, (int, float)) or self._ignored(key, self.ignore_metrics):
                continue
            last = self._last_logged.get(key)
            if (last is not None and last[0] == float(value)
                    and 0 <= at - last[1] < self.log_duplicated_metric_every_n_steps):
                continue  # the same value again within the window
            self._last_logged[key] = (float(value), at)
            values[self.rename_metrics.get(key, key)] = float(value)
        if values:
            self._pending_metrics.append((values, step, int(time.time() * 1000)))
        if time.monotonic() - self._last_flush >= self.flush_interval:
            self._flush()

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Log ``hyperparameters``, flattened to dotted keys, as the run's params."""
        self._start_after_init()
        if not self._enabled() or self._closed:
            return
        for key, value in flatten_hyperparameters(hyperparameters).items():
            if self._ignored(key, self.ignore_hyperparameters):
                continue
            text = str(value)[:_MAX_PARAM_LENGTH]
            known = self._params.get(key)
            if known is None:
                self._params[key] = self._pending_params[key] = text
            elif known != text:
                log.warning("MLFlowLogger: param %r was logged as %r; MLflow params cannot "
                            "change, so the new value %r is not recorded.", key, known, text)
        if self._client is not None:
            self._flush()

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Append ``rows`` to the run's ``{name}.json`` table artifact (``mlflow.log_table``,
        as Composer's ``MLFlowLogger.log_table``; shown in MLflow's artifact and evaluation
        views). A ``step`` column is added when ``step`` is given and the table has none, so
        the rows of several steps (a ``Generate`` table at each interval) stay apart.

        Raises:
            ValueError: a row whose length is not that of ``columns``.
        """
        self._start_after_init()
        if not self._enabled() or self._closed or self._client is None:
            return
        if any(len(row) != len(columns) for row in rows):
            raise ValueError(f"MLFlowLogger.log_table({name!r}): every row needs "
                             f"{len(columns)} values, one per column {list(columns)}.")
        data = {str(c): [to_python(row[i]) for row in rows] for i, c in enumerate(columns)}
        if step is not None and "step" not in data:
            data = {"step": [int(step)] * len(rows), **data}
        with warnings.catch_warnings():
            # mlflow 3.17's select_dtypes(object) on pandas 3: a deprecation nobody here can fix
            warnings.filterwarnings("ignore", message="For backward compatibility, 'str' dtypes")
            self._client.log_table(self.run_id, data=data, artifact_file=f"{name}.json")

    @staticmethod
    def _ignored(name: str, patterns: Sequence[str]) -> bool:
        return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)

    # -- events (AFTER_LOAD and FIT_START start the run: TrackerDestination) ----------------
    def fit_start(self, state: State, logger: Any) -> None:
        super().fit_start(state, logger)  # a destination added after INIT starts here
        self._fit_running = True

    def eval_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._flush()

    def fit_end(self, state: State, logger: Any) -> None:
        del state, logger
        self._fit_running = False
        self._flush()

    def close(self) -> None:
        """Send what is buffered and end the MLflow run ``FINISHED`` or ``FAILED`` (see the
        class docstring). Safe to call twice."""
        self._start_after_init()
        if self._closed:
            return
        self._closed = True
        if self._client is None:
            return
        failed = self._fit_running or sys.exc_info()[0] is not None
        try:
            self._flush()
            if self._system_monitor is not None:
                self._system_monitor.finish()
            self._wait_for_async_logging()  # the queued batches reach the store first
        finally:
            self._client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
