"""The :class:`WandBLogger`: metrics, hyperparameters and (``log_artifacts``) files such as
checkpoints to Weights & Biases.

Source: MosaicML Composer's ``WandBLogger`` (``composer/loggers/wandb_logger.py``); W&B
artifacts (https://docs.wandb.ai/guides/artifacts). ``wandb`` is an optional dependency
(``pip install wandb``), imported only when the logger starts its run.
"""

from __future__ import annotations

import os
import re
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from cadence.loggers.file_logger import jsonable
from cadence.loggers.logger_destination import image_batch, mask_batch, to_python
from cadence.loggers.tracker_destination import TrackerDestination
from cadence.registry import loggers

if TYPE_CHECKING:
    from cadence.core.state import State

__all__ = ["WandBLogger"]

log = logging.getLogger(__name__)

@loggers.register("wandb")
class WandBLogger(TrackerDestination):
    """Logs metrics (``run.log(metrics, step=step)``) and hyperparameters
    (``run.config.update``) to a Weights & Biases run.

    The run is started at ``AFTER_LOAD`` (``wandb.init``), so hyperparameters the Trainer
    logs then (its ``hyperparameters`` argument: e.g. the whole YAML config, and the seed)
    land in the run's config. Metric values may be 0-d tensors; they are read
    (:func:`~cadence.loggers.to_python`, a host sync) when written, not when logged.
    Anything logged before the run starts is kept and sent then. ``step`` is the
    optimizer step (``state.timestamp.batch``); W&B drops values logged at a step lower
    than one it has already seen.

    By default only global rank zero starts a run (one W&B run per training run). With
    ``rank_zero_only=False`` and several ranks, every rank starts its own run, named
    ``<name>-rank<r>`` and grouped under ``group`` (default: the run name).

    One training run is one W&B run: the run's id is kept in every checkpoint, and a run
    that resumes a checkpoint of the same ``run_name`` (autoresume) continues that W&B run
    (``wandb.init(id=<id>, resume="allow")``) instead of starting another. W&B keeps the
    first value logged at a step: after a hard kill, the steps the killed attempt logged
    past its last checkpoint keep that attempt's values (the ``file`` logger marks them).

    With ``log_artifacts=True`` the files the run hands to ``logger.upload_file`` (every
    checkpoint the Trainer saves, ``metrics.jsonl``) become W&B artifacts, as in Composer:
    named after the file (characters other than letters, digits, ``-``, ``_`` and ``.``
    become ``.``, noted once in the log), of type the file's extension (``pt`` becomes ``model``,
    for W&B's model registry), with the run's timestamp as metadata (``timestamp/<field>``,
    and ``eval_timestamp/<field>`` during eval), and the aliases ``latest`` and
    ``ep<epoch>-ba<batch>``. The file is copied into W&B's staging area at the call
    (``policy="mutable"``), so the run may delete it afterwards; the upload itself happens
    in W&B's background process. :meth:`download_file` fetches one back.

    The run is finished (``run.finish()``) in :meth:`close`, which is safe to call twice.
    To log without a W&B account or network, set ``WANDB_MODE=offline`` (or pass
    ``init_kwargs={"mode": "offline"}``): the run is written under ``<dir>/wandb/offline-run-*``
    and can be uploaded later with ``wandb sync``.

    Args:
        project: the W&B project; default W&B's (``WANDB_PROJECT``, else ``uncategorized``).
        entity: the W&B team or user; default W&B's (``WANDB_ENTITY``, else your default).
        name: the W&B run's display name; default the run's ``run_name``.
        tags: tags for the W&B run.
        group: groups runs in the W&B UI (e.g. the ranks of one run, or a sweep).
        dir: the directory ``wandb/`` is written into; may contain ``{run_name}``. Default:
            the ``WANDB_DIR`` environment variable when set (as ``wandb.init`` and Composer's
            logger honour it, e.g. to put runs on scratch space), else the run's
            ``save_folder`` if it has one, else ``runs/{run_name}``. Created if missing.
        rank_zero_only: start a run on global rank zero only (default); else on every rank.
        init_kwargs: more keyword arguments for ``wandb.init`` (``mode``, ``notes``,
            ``settings``, ``reinit``, ...); they override the arguments above. A ``config``
            here is the run's initial config, as in Composer; the hyperparameters logged
            later are merged over it.
        log_artifacts: store the files handed to ``upload_file`` as W&B artifacts (see
            above). Default False.

    Raises:
        ImportError: ``wandb`` is not installed (at construction, and when the run starts), naming
            ``pip install wandb``.
        TypeError: ``init_kwargs['config']`` is not a mapping.

    Example::

        trainer = Trainer(..., loggers=[WandBLogger(project="gpt2-small", tags=["baseline"])])
    """

    package = "wandb"
    keeps_run_id = True

    def __init__(
        self,
        project: Optional[str] = None,
        group: Optional[str] = None,
        name: Optional[str] = None,
        entity: Optional[str] = None,
        tags: Optional[Sequence[str]] = None,
        log_artifacts: bool = False,
        rank_zero_only: bool = True,
        init_kwargs: Optional[Mapping[str, Any]] = None,
        dir: Optional[str] = None,  # noqa: A002 - the name wandb.init uses
    ) -> None:
        super().__init__(rank_zero_only)
        init_kwargs = dict(init_kwargs or {})
        config = init_kwargs.get("config")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"WandBLogger init_kwargs['config'] must be a dict (the run's "
                            f"initial wandb.config), got {type(config).__name__}.")
        self.project = project
        self.entity = entity
        self.name = name
        self.tags = list(tags) if tags is not None else None
        self.group = group
        self.dir = dir
        self.init_kwargs = init_kwargs
        # Composer's view of the same (llm-foundry's tests read it): ``init_kwargs`` (its
        # ``config`` included) with the explicit arguments that are not None set on it
        self._init_kwargs: dict[str, Any] = {**init_kwargs, **{
            key: value for key, value in (("project", project), ("group", group),
                                          ("name", name), ("entity", entity), ("tags", tags))
            if value is not None}}
        self.log_artifacts = bool(log_artifacts)
        self._renamed_noted = False
        self._run: Any = None
        self._run_id: Optional[str] = None
        self._finished = False
        self._pending_config: dict[str, Any] = dict(config or {})
        self._pending_metrics: list[tuple[dict[str, Any], Optional[int]]] = []

    # -- the W&B run ----------------------------------------------------------------------
    @property
    def run(self) -> Any:
        """The ``wandb`` run this logger writes to, or ``None`` (not started, finished, or a
        rank that does not log)."""
        return self._run

    def _wandb_init_kwargs(self, state: State) -> dict[str, Any]:
        run_name = state.run_name
        name = self._rank_name(self.name if self.name is not None else run_name)
        group = self.group
        if self._per_rank():
            group = group if group is not None else run_name
        if self.dir is not None:
            folder = self.dir.format(run_name=run_name)
        elif os.environ.get("WANDB_DIR"):
            folder = os.path.expanduser(os.environ["WANDB_DIR"])
        elif state.save_folder is not None:
            folder = str(state.save_folder)
        else:
            folder = f"runs/{run_name}"
        Path(folder).mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {
            "project": self.project, "entity": self.entity, "name": name, "tags": self.tags,
            "group": group, "dir": folder,
        }
        if self.resume_id is not None:  # the checkpoint's run: continue it
            kwargs.update(id=self.resume_id, resume="allow")
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        kwargs.update({k: v for k, v in self.init_kwargs.items() if k != "config"})
        return kwargs

    def run_id_to_resume(self) -> Optional[str]:
        """The W&B run's id (kept in checkpoints), once the run started."""
        return self._run_id

    def _start(self, state: State) -> None:
        if self._run is not None or self._finished or not self._enabled():
            return
        wandb = self.import_package()
        self._run = wandb.init(config=self._pending_config or None, **self._wandb_init_kwargs(state))
        self._run_id = str(self._run.id)
        self._pending_config = {}
        pending, self._pending_metrics = self._pending_metrics, []
        for metrics, step in pending:
            self._log(metrics, step)

    def _log(self, metrics: dict[str, Any], step: Optional[int]) -> None:
        if step is None:
            self._run.log(metrics)
        else:
            self._run.log(metrics, step=step)

    # -- LoggerDestination ----------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        """Send ``metrics`` to the run at ``step`` (tensors are read here)."""
        self._start_after_init()
        if not self._enabled() or self._finished or not metrics:
            return
        values = {str(key): to_python(value) for key, value in metrics.items()}
        if self._run is None:
            self._pending_metrics.append((values, step))
        else:
            self._log(values, step)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Merge ``hyperparameters`` into the run's config (``run.config.update``)."""
        self._start_after_init()
        if not self._enabled() or self._finished:
            return
        config = jsonable(dict(hyperparameters))
        if self._run is None:
            self._pending_config.update(config)
        else:
            self._run.config.update(config, allow_val_change=True)

    def log_table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                  name: str = "Table", step: Optional[int] = None) -> None:
        """Log the table as a ``wandb.Table`` under ``name`` at ``step``."""
        self._start_after_init()
        if not self._enabled() or self._finished or self._run is None:
            return
        wandb = self.import_package()
        data = [[to_python(value) for value in row] for row in rows]
        self._log({name: wandb.Table(columns=list(columns), data=data)}, step)

    def log_images(self, images: Any, name: str = "Images", channels_last: bool = False,
                   step: Optional[int] = None, masks: Optional[Mapping[str, Any]] = None,
                   mask_class_labels: Optional[Mapping[int, str]] = None,
                   use_table: bool = True) -> None:
        """Log ``images`` as a list of ``wandb.Image`` s under ``name``, with segmentation
        ``masks`` overlaid (``mask_class_labels`` names their classes).

        ``use_table`` is accepted and has no effect: a ``wandb.Table`` of images is written
        without its image files by wandb 0.31 (the table holds the text ``"Image"``), so the
        images are always logged as a list, which the W&B UI shows as a media panel."""
        del use_table
        self._start_after_init()
        if not self._enabled() or self._finished or self._run is None:
            return
        wandb = self.import_package()
        batch = image_batch(images, channels_last)
        mask_batches = {k: mask_batch(v) for k, v in (masks or {}).items()}
        pictures = []
        for index, image in enumerate(batch):
            overlays = {k: {"mask_data": m[index].numpy(),
                            **({"class_labels": dict(mask_class_labels)}
                               if mask_class_labels else {})}
                        for k, m in mask_batches.items()}
            pictures.append(wandb.Image(image.permute(1, 2, 0).numpy(),
                                        masks=overlays or None))
        self._log({name: pictures}, step)

    # -- artifacts ------------------------------------------------------------------------
    def can_upload_files(self) -> bool:
        """Whether files go to W&B: ``log_artifacts``."""
        return self.log_artifacts

    def upload_file(self, state: State, remote_file_name: str, file_path: Path, *,
                    overwrite: bool) -> None:
        """Log the file ``file_path`` as a W&B artifact named after ``remote_file_name`` (see
        the class docstring); nothing when ``log_artifacts`` is False or this rank has no
        run. ``overwrite`` is ignored: W&B versions artifacts of one name instead."""
        del overwrite
        self._start_after_init()
        if not self.log_artifacts or not self._enabled() or self._finished:
            return
        if self._run is None:
            self._start(state)
        wandb = self.import_package()
        name = re.sub(r"[^a-zA-Z0-9-_.]", ".", remote_file_name)
        if name != remote_file_name and not self._renamed_noted:
            self._renamed_noted = True  # Composer warns on every file; its default names do
            log.info("WandBLogger: W&B artifact names allow only letters, digits, '-', '_' "
                     "and '.'; other characters become '.' (%r is stored as %r).",
                     remote_file_name, name)
        extension = name.rsplit(".", 1)[-1] if "." in name else "file"
        timestamp = state.timestamp
        metadata = {f"timestamp/{k}": _plain(v) for k, v in timestamp.state_dict().items()}
        if state.dataloader is not None and state.dataloader is not state.train_dataloader:
            metadata.update({f"eval_timestamp/{k}": _plain(v)
                             for k, v in state.eval_timestamp.state_dict().items()})
        artifact = wandb.Artifact(name=name, type="model" if extension == "pt" else extension,
                                  metadata=metadata)
        artifact.add_file(os.path.abspath(file_path), policy="mutable")  # copied now
        aliases = ["latest", f"ep{int(timestamp.epoch)}-ba{int(timestamp.batch)}"]
        self._run.log_artifact(artifact, aliases=aliases)

    def download_file(self, remote_file_name: str, destination: str, overwrite: bool = False,
                      progress_bar: bool = True) -> None:
        """Download the artifact ``remote_file_name`` (``name`` or ``name:alias``, default
        alias ``latest``; ``entity/project/`` is added from this logger's when missing) to
        the file ``destination``, through W&B's public API (needs the network and an
        account; not available offline).

        Raises:
            FileExistsError: ``destination`` exists and ``overwrite`` is False.
            FileNotFoundError: the artifact does not exist or holds no single file.
        """
        del progress_bar
        if os.path.exists(destination) and not overwrite:
            raise FileExistsError(f"{destination} exists; pass overwrite=True to replace it.")
        wandb = self.import_package()
        name = remote_file_name if ":" in remote_file_name else f"{remote_file_name}:latest"
        if name.count("/") < 2:
            prefix = "/".join(p for p in (self.entity, self.project) if p)
            name = f"{prefix}/{name}" if prefix else name
        try:
            artifact = wandb.Api().artifact(name=name)
        except wandb.errors.CommError as exc:
            raise FileNotFoundError(f"W&B artifact {name} could not be fetched: {exc}") from exc
        with tempfile.TemporaryDirectory(prefix="cadence-wandb-") as tmp:
            artifact.download(root=tmp)
            files = [p for p in Path(tmp).rglob("*") if p.is_file()]
            if len(files) != 1:
                raise FileNotFoundError(f"W&B artifact {name} holds {len(files)} files, not one.")
            Path(destination).parent.mkdir(parents=True, exist_ok=True)
            os.replace(files[0], destination)

    # -- events (AFTER_LOAD and FIT_START start the run: TrackerDestination) ---------------
    def close(self) -> None:
        """Finish the W&B run (``run.finish()``), flushing what was logged. Safe to call twice.

        Metrics logged but never sent (the run never started) are dropped.
        """
        self._start_after_init()
        self._pending_metrics = []
        self._pending_config = {}
        if self._run is not None:
            run, self._run = self._run, None
            self._finished = True
            run.finish()


def _plain(value: Any) -> Any:
    """A timestamp field as JSON (``datetime.timedelta``: seconds)."""
    seconds = getattr(value, "total_seconds", None)
    return seconds() if callable(seconds) else to_python(value)
