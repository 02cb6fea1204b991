"""The :class:`Trainer`: wiring in ``__init__``, then ``fit`` and ``eval`` as loops of small
named steps. The order of events is documented on :class:`~cadence.Event`.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import torch

from cadence.utils.device import get_device
from cadence.utils.misc import unwrap_model
from cadence.models.base import ComposerModel
from cadence.utils import dist
from cadence.trainer.auto_microbatch import forward_backward_auto, parse_microbatch_size
from cadence.trainer.checkpointing import (
    add_run_saver, checkpoint_metadata, run_saver, save_now,
)
from cadence.trainer.closures import step_with_closure, sync_context, uses_closure
from cadence.trainer.grad_sync import GradientSync
from cadence.trainer.metrics_setup import build_metrics
from cadence.trainer.wall_clock import WallClock
from cadence.trainer.loss_weighting import LossWeighting, mean_over_ranks
from cadence.checkpoint.data_position import iter_epoch
from cadence.checkpoint.files import pointer_name
from cadence.checkpoint.lock import release_on_error
from cadence.checkpoint.object_store import check_object_store
from cadence.checkpoint.remote import check_url
from cadence.checkpoint.resume import load_at_start
from cadence.checkpoint.run_folder import RunFolder
from cadence.core import (
    Algorithm, Callback, Engine, Evaluator, Event, State, Time, TimeLike, TimeUnit,
)
from cadence.trainer import trainer_options as options
from cadence.trainer.trainer_options import EvalDataloader, as_list
from cadence.trainer.eval_schedule import eval_due, parse_eval_interval
from cadence.trainer.fit_args import FitChanges, fit_changes
from cadence.loggers.logger import Logger
from cadence.loggers.logger_destination import LoggerDestination
from cadence.core.data_spec import (DataSpec, batch_to_device, count_tokens, ensure_data_spec,
                                     no_transform, tensor_shapes)
from cadence.optim.optimizers import compile_scheduler, trainable_parameters
from cadence.registry.errors import did_you_mean
from cadence.parallel import ParallelismConfig, ParallelPlan, parallelize, remap_optimizer_params
from cadence.parallel.compile import CompileConfig
from cadence.parallel.parallel_dims import ParallelDims
from cadence.parallel.pipeline import parallelize_pipeline
from cadence.trainer.pipeline_step import PipelineStep, check_pipeline_run, refuse
from cadence.parallel.elastic import check_resume_layout
from cadence.parallel.data import (
    align_sampler_with_data_parallel, check_distributed_sampler,
)
from cadence.core.precision import Precision
from cadence.trainer.run_plan import RunPlan
from cadence.trainer.eval_loop import EvalInterrupted, evaluate
from cadence.trainer.predict import predict_loop
from cadence.profiler.profiler import bind_profilers
from cadence.trainer.preemption import Preemption
from cadence.trainer.trainer_config import FLAT_KEYS, TrainerConfig, with_settings_signature
from cadence.utils.precision import check_precision
from cadence.utils.reproducibility import seed_all

__all__ = ["Trainer"]

log = logging.getLogger(__name__)

class Trainer:
    """Trains a :class:`~cadence.ComposerModel`, firing events for algorithms and callbacks.

    The arguments are Composer's, in Composer's order. The objects a run is made of are
    documented here; every other argument is a *setting*, documented once, on the section of
    :class:`~cadence.trainer.trainer_config.TrainerConfig` that owns it, and typed and
    checked there before anything is built (all problems at once, each naming its key):

    - the run, length and step (``run_name``, ``seed``, ``device``, ``precision``,
      ``max_duration``, ``device_train_microbatch_size``, ``dist_timeout``, ...):
      :class:`~cadence.trainer.trainer_config.RunConfig`;
    - evaluation (``eval_interval``, ``eval_subset_num_batches``):
      :class:`~cadence.trainer.trainer_config.EvalConfig`;
    - logging (``log_interval``, ``progress_bar``, ``log_to_console``, ...):
      :class:`~cadence.trainer.trainer_config.LoggingConfig`;
    - checkpoints (``save_*``, ``load_*``, ``autoresume``, ``require_checksums``):
      :class:`~cadence.checkpoint.checkpoint_config.CheckpointConfig`;
    - preemption (``preemption_signals``, ``preemption_timeout``, ``requeue``):
      :class:`~cadence.trainer.preemption.PreemptionConfig`;
    - ``parallelism_config`` (``{"fsdp": {...}, "tp": {...}, "pp": {...}}`` or a
      :class:`~cadence.parallel.ParallelismConfig`) and ``compile_config`` (a dict or a
      :class:`~cadence.parallel.compile.CompileConfig`), applied by the parallelize plan
      (:mod:`cadence.parallel.plan`).

    cadence's own settings (``log_interval``, ``save_state_dict_type``, ``save_async``,
    ``save_allow_nonfinite``, ``require_checksums``, ``preemption_*``, ``requeue``, and any
    field a section gains) are keyword arguments too; ``trainer.config`` is the typed tree.

    Args:
        model: the model to train.
        train_dataloader: yields training batches (tensor, dict or tuple, samples first), or
            a :class:`~cadence.DataSpec` (its transforms, splitting and counters are used).
        algorithms: :class:`~cadence.Algorithm` s, run in this order (reversed on ``AFTER_*``).
        algorithm_passes: extra ordering passes for the algorithms (Composer's argument): a
            function ``(algorithms, event) -> algorithms``, a ``(pass, index)`` pair, or a
            list of these; see :mod:`cadence.core.passes`.
        optimizers: an optimizer (or a one-element list); default ``AdamW(lr=1e-3)`` on the
            model's parameters, built after ``INIT`` so it sees any model surgery.
        schedulers: :class:`~cadence.optim.optimizers.ComposerScheduler` s or torch
            ``LRScheduler`` s, stepped once per batch.
        eval_dataloader: a dataloader (labelled ``eval``), an :class:`~cadence.Evaluator`, or
            a list of Evaluators.
        callbacks: :class:`~cadence.Callback` s.
        loggers: :class:`~cadence.loggers.LoggerDestination` s.
        profiler: a :class:`~cadence.profiler.Profiler` (bound to ``state.profiler``; the
            Engine then records event durations).
        hyperparameters: logged once through every logger destination (e.g. the YAML config).
        **settings: cadence's own settings by flat key (see above); an unknown one raises
            ``TypeError`` with "did you mean".

    Raises:
        ValueError / TypeError: for bad arguments, naming the argument and the fix, before any
            event fires.
        SaveFolderInUse: another live run holds ``save_folder`` (its lock file
            ``cadence.lock`` names the run's host, PID and start time); see
            :mod:`cadence.checkpoint.lock`.
    """

    @with_settings_signature  # every section's setting shows in the signature
    @release_on_error("_run_folder")  # a failed __init__ does not keep the save folder locked
    def __init__(
        self,
        model: torch.nn.Module,
        # Composer's arguments, in Composer's order
        train_dataloader: Optional[Iterable[Any]] = None,
        train_dataloader_label: str = "train",
        train_subset_num_batches: int = -1,
        spin_dataloaders: bool = True,
        max_duration: Optional[TimeLike] = None,
        algorithms: Union[Algorithm, Sequence[Algorithm]] = (),
        algorithm_passes: Any = None,
        optimizers: Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer], None] = None,
        schedulers: Any = None,
        scale_schedule_ratio: float = 1.0,
        step_schedulers_every_batch: Optional[bool] = None,
        eval_dataloader: Optional[EvalDataloader] = None,
        eval_interval: TimeLike = "1ep",
        eval_subset_num_batches: int = -1,
        callbacks: Union[Callback, Sequence[Callback]] = (),
        loggers: Union[LoggerDestination, Sequence[LoggerDestination]] = (),
        run_name: Optional[str] = None,
        progress_bar: bool = True,
        log_to_console: bool = False,
        console_stream: Any = "stderr",
        console_log_interval: Optional[TimeLike] = None,
        log_traces: bool = False,
        auto_log_hparams: bool = False,
        load_path: Optional[str] = None,
        load_object_store: Any = None,
        load_weights_only: bool = False,
        load_strict_model_weights: bool = True,
        load_progress_bar: bool = True,
        load_ignore_keys: Optional[Sequence[str]] = None,
        load_exclude_algorithms: Optional[Sequence[str]] = None,
        save_folder: Optional[str] = None,
        save_filename: str = "ep{epoch}-ba{batch}-rank{rank}.pt",
        save_latest_filename: Optional[str] = "latest-rank{rank}.pt",
        save_overwrite: bool = False,
        save_interval: Any = "1ep",
        save_weights_only: bool = False,
        save_ignore_keys: Optional[Union[list[str], Callable[[dict], None]]] = None,
        save_num_checkpoints_to_keep: int = -1,
        save_metrics: bool = False,
        autoresume: bool = False,
        parallelism_config: Any = None,
        device: Union[str, torch.device, None] = None,
        precision: Union[str, Precision] = "fp32",
        precision_config: Optional[dict[str, Any]] = None,
        device_train_microbatch_size: Union[int, str, None] = None,
        accumulate_train_batch_on_tokens: bool = False,
        seed: Optional[int] = None,
        deterministic_mode: bool = False,
        dist_timeout: float = 600.0,
        ddp_sync_strategy: Optional[str] = None,
        profiler: Any = None,
        python_log_level: Optional[str] = None,
        compile_config: Any = None,
        # cadence's own
        hyperparameters: Optional[Mapping[str, Any]] = None,
        **settings: Any,
    ) -> None:
        arguments = {k: v for k, v in locals().items() if k in FLAT_KEYS}
        unknown = [key for key in settings if key not in FLAT_KEYS]
        if unknown:  # as Python says it, with the setting it may have meant
            raise TypeError(f"Trainer() got an unexpected keyword argument {unknown[0]!r}."
                            f"{did_you_mean(unknown[0], list(FLAT_KEYS))}")
        # every setting typed and checked at once, before anything is built
        self.config = config = TrainerConfig.from_flat({**arguments, **settings}, "Trainer")
        run, checkpoint = config.run, config.checkpoint
        init_args = {**arguments, **settings, "model": model} if run.auto_log_hparams else {}
        ddp_sync_strategy = options.apply_run_settings(run)
        load_ignore_keys = [*checkpoint.load_ignore_keys,
                            *options.excluded_algorithm_keys(checkpoint.load_exclude_algorithms)]
        options.check_model(model)
        # a DataSpec (Composer's) or a plain dataloader; the state holds the dataloader itself
        self._train_spec = None if train_dataloader is None else ensure_data_spec(train_dataloader)
        train_dataloader = None if self._train_spec is None else self._train_spec.dataloader
        auto_microbatching, microbatch_size = parse_microbatch_size(
            run.device_train_microbatch_size)  # 'auto': None, the batch size at the first batch
        if len(as_list(optimizers)) > 1:
            raise ValueError("Only one optimizer is supported; put parameter groups in one optimizer.")
        self.eval_interval = parse_eval_interval(config.eval.eval_interval)
        self.scale_schedule_ratio = float(run.scale_schedule_ratio)
        self.train_dataloader_label = run.train_dataloader_label
        self.step_schedulers_every_batch = options.steps_schedulers_every_batch(
            as_list(schedulers), run.step_schedulers_every_batch)
        self.log_interval = Time.from_input(config.logging.log_interval, TimeUnit.BATCH)
        self.eval_subset_num_batches = int(config.eval.eval_subset_num_batches)
        device_obj = get_device(run.device).torch_device  # 'cpu', 'gpu', 'cuda:1', a Device
        check_precision(run.precision, device_obj)  # amp_bf16 where bf16 is native only
        self._on_tokens = bool(run.accumulate_train_batch_on_tokens)
        self._preemption = Preemption(config.preemption.preemption_signals,
                                      config.preemption.preemption_timeout,
                                      config.preemption.requeue)
        self._wall_clock = WallClock()  # the timestamp's *_wct clocks
        dist.initialize_dist(device_obj, timeout=run.dist_timeout)
        # the degrees, checked against the world size before anything is built; data-parallel
        # ranks load (and seed) apart, the ranks of one tensor-parallel group alike
        parallel_dims = ParallelDims.from_config(config.parallelism)
        check_distributed_sampler(train_dataloader, "train_dataloader", parallel_dims.dp_size)
        align_sampler_with_data_parallel(train_dataloader, "train_dataloader",
                                         parallel_dims.dp_size, parallel_dims.dp_rank)
        run_name, rank_zero_seed = options.run_name_and_seed(
            run.run_name, run.seed, checkpoint.autoresume, checkpoint.save_folder)
        seed_all(rank_zero_seed)  # INIT's surgery draws the same new weights on every rank
        # a URL (s3://...) saves to object storage through a local stage; an unknown protocol
        # or a missing extra (of save_folder or load_path) is refused now
        self._run_folder = RunFolder.of(checkpoint.save_folder, run_name)
        if checkpoint.load_path is not None and checkpoint.load_object_store is None:
            check_url(checkpoint.load_path)
        check_object_store(checkpoint.load_object_store)

        self.state = State(
            model=model,
            rank_zero_seed=rank_zero_seed,
            optimizers=optimizers,  # a user's optimizer follows INIT's model surgery
            run_name=run_name,
            save_folder=None if self._run_folder is None else str(self._run_folder.local),
            device=device_obj,
            max_duration=options.scale_duration(options.parse_duration(run.max_duration),
                                                run.scale_schedule_ratio),
            precision=run.precision,
            device_train_microbatch_size=microbatch_size,
            auto_microbatching=auto_microbatching,
            save_metrics=checkpoint.save_metrics,
            train_dataloader=train_dataloader,
            dataloader_label=run.train_dataloader_label if train_dataloader is not None else None,
            dataloader_len=options.subset_len(options.dataloader_len(train_dataloader),
                                              run.train_subset_num_batches),
            evaluators=options.as_evaluators(eval_dataloader),
            algorithms=as_list(algorithms),
            callbacks=as_list(callbacks) + options.profiler_callbacks(profiler),
            parallelism_config=config.parallelism,
            parallel_dims=parallel_dims,
            compile_config=config.compile,
        )
        bind_profilers(self.state)  # a Profiler: state.profiler, its profilers and handlers
        # one run per save folder (rank 0 locks it; released by close() or at exit)
        if self._run_folder is not None:  # (and a remote folder's logs are fetched)
            self._run_folder.lock(run_name)
        destinations = as_list(loggers) + options.console_destinations(
            as_list(loggers), config.logging, self.log_interval)
        self.hyperparameters = {**options.extract_hparams(init_args), **(hyperparameters or {})}
        self.hyperparameters.setdefault("rank_zero_seed", rank_zero_seed)
        add_run_saver(self.state, self._run_folder, self._checkpoint_metadata(), checkpoint)
        self.logger = Logger(self.state, destinations)
        if isinstance(model, ComposerModel):
            model.logger = self.logger  # Composer's ComposerModel.logger
        self.engine = Engine(self.state, self.logger, algorithm_passes, destinations=destinations)

        if parallel_dims.pp_enabled:  # what cannot run under a pipeline, before INIT's surgery
            check_pipeline_run(self.state, auto_microbatching)
        self.engine.run_event(Event.INIT)
        seed_all(rank_zero_seed + self._dp_rank)  # then each data-parallel rank its own stream
        self._parallelize(as_list(optimizers))
        self._weighting = LossWeighting(self._module, self._on_tokens, self._dp_size,
                                        self._metric_group)  # the data-parallel group
        self._grad_sync = GradientSync(self.state.model, self.state.fsdp_config,
                                       ddp_sync_strategy)
        self._build_optimizers(as_list(optimizers), as_list(schedulers))
        self._build_metrics()
        self._pipeline: Optional[PipelineStep] = None  # parallelism_config.pp: the schedule's step
        if self._pipeline_parts is not None:
            self._pipeline = PipelineStep(self._pipeline_parts, self.state, self.engine,
                                          self._weighting)
        # eval and predict under a pipeline: its forward-only pass (else None: the model)
        self._forward_only = None if self._pipeline is None else self._pipeline.forward_only
        self.engine.run_event(Event.BEFORE_LOAD)
        loaded = load_at_start(  # autoresume or load_path; a remote one downloaded, then removed
            self.state, self._run_folder,
            pointer_name(checkpoint.save_latest_filename, run_name),
            checkpoint.load_path, checkpoint.autoresume, weights_only=checkpoint.load_weights_only,
            strict=checkpoint.load_strict_model_weights, ignore_keys=load_ignore_keys,
            require_checksums=checkpoint.require_checksums,
            check_layout=lambda local: check_resume_layout(
                local, self.state, self.state.parallelism_config, load_ignore_keys),
            object_store=checkpoint.load_object_store)
        if loaded is not None:  # which checkpoint this run started from, in every destination
            self.state.load_path = loaded
            self.hyperparameters["loaded_checkpoint"] = loaded
        self.engine.run_event(Event.AFTER_LOAD)
        self.logger.log_hyperparameters(self.hyperparameters)

    # ------------------------------------------------------------------ views of the state
    # The state owns these (Composer's callbacks read them there); the Trainer keeps no copy.
    @property
    def parallelism_config(self) -> ParallelismConfig:
        """The run's typed ``parallelism_config`` (``state.parallelism_config``)."""
        return self.state.parallelism_config

    @property
    def compile_config(self) -> Optional[CompileConfig]:
        """The run's typed ``compile_config`` (``state.compile_config``)."""
        return self.state.compile_config

    @property
    def parallel_dims(self) -> ParallelDims:
        """The run's degrees, mesh and data-parallel group (``state.parallel_dims``)."""
        return self.state.parallel_dims

    @property
    def grad_scaler(self) -> Optional[torch.amp.GradScaler]:
        """The ``amp_fp16`` gradient scaler (``state.scaler``), else None."""
        return self.state.scaler

    @property
    def _dp_size(self) -> int:
        return self.state.parallel_dims.dp_size

    @property
    def _dp_rank(self) -> int:
        return self.state.parallel_dims.dp_rank

    @property
    def _metric_group(self) -> Any:
        """What metrics sum over: the data-parallel peers (a TP group shares its samples)."""
        return self.state.parallel_dims.data_parallel_group()

    # ------------------------------------------------------------------ wiring
    def _checkpoint_metadata(self) -> dict[str, Any]:
        return checkpoint_metadata(self.state, self.hyperparameters, self.parallelism_config)

    def _parallelize(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Apply the parallelize plan once (activation checkpointing, compile, TP, FSDP2 /
        DDP; :mod:`cadence.parallel.plan`), which also puts the model on the device: only
        its shards when sharded (a meta model initialised after sharding, seeded by
        ``rank_zero_seed``). A user's optimizer is pointed at the parameters it creates."""
        state = self.state
        module = state.model
        names = {id(p): n for n, p in module.named_parameters()}
        plan = ParallelPlan(state.parallelism_config, state.compile_config, state.device,
                            state.precision, seed=state.rank_zero_seed,
                            dims=state.parallel_dims)  # the mesh is built once, there
        self._pipeline_parts = None
        if state.parallel_dims.pp_enabled:  # stages split, then each parallelized
            self._pipeline_parts = parallelize_pipeline(module, plan)
            state.model = self._module = self._pipeline_parts.model  # this rank's modules
            for optimizer in optimizers:  # this rank's stages' parameters only
                remap_optimizer_params(optimizer, names, self._module, drop_absent=True)
        else:
            state.model = parallelize(module, plan)
            self._module = unwrap_model(state.model)
            if any(id(p) not in names for p in self._module.parameters()):
                for optimizer in optimizers:
                    remap_optimizer_params(optimizer, names, self._module)
        self._align_eval_samplers()

    def _align_eval_samplers(self) -> None:
        """Eval samplers split over the data-parallel ranks (a TP group evaluates together)."""
        for evaluator in self.state.evaluators:
            align_sampler_with_data_parallel(evaluator.dataloader.dataloader,
                                             f"eval {evaluator.label!r}",
                                             self._dp_size, self._dp_rank)

    def _build_optimizers(self, optimizers: list[Any], schedulers: list[Any]) -> None:
        state = self.state
        if not optimizers:
            optimizers = [torch.optim.AdamW(trainable_parameters(state.model), lr=1e-3)]
        state.optimizers = optimizers
        state.schedulers = [compile_scheduler(s, optimizers[0], state, self.scale_schedule_ratio)
                            for s in schedulers]
        state.scaler = options.grad_scaler_for(state.precision, state.device)

    def _build_metrics(self) -> None:
        build_metrics(self.state, self._module, self._metric_group)

    # ------------------------------------------------------------------ fit
    def fit(self, *, train_dataloader: Optional[Iterable[Any]] = None,
            train_dataloader_label: str = "train", train_subset_num_batches: int = -1,
            spin_dataloaders: Optional[bool] = None, duration: Optional[TimeLike] = None,
            reset_time: bool = False, schedulers: Any = None, scale_schedule_ratio: float = 1.0,
            step_schedulers_every_batch: Optional[bool] = None,
            eval_dataloader: Optional[EvalDataloader] = None, eval_subset_num_batches: int = -1,
            eval_interval: Any = 1, device_train_microbatch_size: Union[int, str, None] = None,
            precision: Union[str, Precision, None] = None) -> None:
        """Train until ``max_duration`` (or until a callback sets ``state.stop_training``).

        Composer's arguments change the run before it starts; see
        :func:`~cadence.trainer.fit_args.fit_changes`. ``duration`` trains that much
        more (``max_duration`` becomes now + ``duration``); ``reset_time`` starts the
        timestamp from 0; ``eval_interval`` and ``eval_subset_num_batches`` apply with
        ``eval_dataloader``; ``spin_dataloaders`` has no effect (cadence resumes a dataloader
        from the checkpoint's data position).

        Raises:
            ValueError: no train dataloader or no max_duration was given; a bad argument.
        """
        del spin_dataloaders
        arguments = {name: value for name, value in locals().items() if name != "self"}
        self._apply_fit(fit_changes(self.state, **arguments))  # checked before any change
        state = self.state
        if state.train_dataloader is None or state.max_duration is None:
            raise ValueError("fit() needs both train_dataloader and max_duration on the Trainer.")
        if state.dataloader_len == 0:
            raise ValueError("The train dataloader is empty (len 0); check batch_size and drop_last.")
        if self._train_spec is None or self._train_spec.dataloader is not state.train_dataloader:
            self._train_spec = ensure_data_spec(state.train_dataloader)  # set on the state
        state.stop_training = False
        # decided once per fit: the log schedule, the precision context, the done check
        self._run_plan = RunPlan(state, self.log_interval, self.logger.destinations)
        self._wall_clock.start()  # timestamp.total_wct counts from here
        self.engine.run_event(Event.FIT_START)
        with self._preemption.watch(state):  # a signal: checkpoint, close, raise Preempted
            while not self._run_plan.training_done(state):
                self._train_epoch()
        self.engine.run_event(Event.FIT_END)

    def _apply_fit(self, changes: FitChanges) -> None:
        """Make what ``fit()``'s arguments change: the state's, then the Trainer's own."""
        check_precision(changes.precision or "fp32", self.state.device)
        if changes.train_dataloader is not None:  # the sampler counts data-parallel ranks
            self._train_spec = changes.train_data_spec
            check_distributed_sampler(changes.train_dataloader, "train_dataloader", self._dp_size)
            align_sampler_with_data_parallel(changes.train_dataloader, "train_dataloader",
                                             self._dp_size, self._dp_rank)
            self.train_dataloader_label = changes.train_dataloader_label
        changes.apply_to_state(self.state)
        if changes.scale_schedule_ratio != 1.0:
            self.scale_schedule_ratio = changes.scale_schedule_ratio
        if changes.step_schedulers_every_batch is not None:
            self.step_schedulers_every_batch = changes.step_schedulers_every_batch
        if changes.evaluators is not None:
            self.eval_interval = changes.eval_interval
            self.eval_subset_num_batches = changes.eval_subset_num_batches
            self._align_eval_samplers()
            self._build_metrics()
        if changes.auto_microbatch is not None:
            self.state.auto_microbatching = changes.auto_microbatch
        if changes.precision is not None:
            self.state.scaler = options.grad_scaler_for(self.state.precision, self.state.device)

    def predict(self, dataloader: Union[Iterable[Any], DataSpec], subset_num_batches: int = -1, *,
                return_outputs: bool = True) -> list[Any]:
        """The model's outputs on every batch of ``dataloader`` (Composer's
        ``Trainer.predict``, firing the ``PREDICT_*`` events; see
        :func:`~cadence.trainer.predict.predict_loop`).

        Returns:
            The outputs of each batch, on the CPU, when ``return_outputs``; else ``[]``.
        """
        spec = ensure_data_spec(dataloader)  # a DataSpec's transforms run too
        if self._pipeline is not None:  # the stages of one pipeline take the same samples
            align_sampler_with_data_parallel(spec.dataloader, "predict dataloader",
                                             self._dp_size, self._dp_rank)
        return predict_loop(self.state, self.engine, spec.dataloader, subset_num_batches,
                            return_outputs, data_spec=spec, pipeline=self._forward_only)

    @property
    def saved_checkpoints(self) -> list[str]:
        """Paths of the checkpoints the run's ``CheckpointSaver`` saved and still keeps,
        oldest first (Composer's ``Trainer.saved_checkpoints``); ``[]`` without one."""
        saver = run_saver(self.state.callbacks)
        return [] if saver is None else saver.saved_checkpoints

    def save_checkpoint(self, name: str = "ep{epoch}-ba{batch}-rank{rank}", *,
                        weights_only: bool = False) -> Optional[str]:
        """Save a checkpoint now (Composer's ``Trainer.save_checkpoint``); call on every rank.
        ``name`` takes ``{run_name}``, ``{epoch}``, ``{batch}``, ``{rank}`` and lands in
        ``save_folder`` (else the working directory), in the run's state-dict type (a full
        one gets ``.pt``). Returns the checkpoint's path."""
        return save_now(self.state, self.logger, self._run_folder, self._checkpoint_metadata(),
                        self.parallelism_config, name, weights_only)

    def export_for_inference(self, save_format: str, save_path: str,
                             save_object_store: Any = None, sample_input: Any = None,
                             transforms: Optional[Sequence[Any]] = None,
                             input_names: Optional[Sequence[str]] = None,
                             output_names: Optional[Sequence[str]] = None) -> None:
        """Export the model (Composer's ``Trainer.export_for_inference``): see
        :func:`cadence.utils.inference.export_with_logger`. ``sample_input`` is one input of
        the model (a batch); for ONNX it defaults to the last training batch."""
        from cadence.utils.inference import export_with_logger

        if self._pipeline is not None:
            refuse("Trainer.export_for_inference()")
        if sample_input is None and str(getattr(save_format, "value", save_format)) == "onnx":
            sample_input = self.state.batch
        export_with_logger(self._module, save_format, save_path, self.logger,
                           save_object_store=save_object_store, transforms=transforms,
                           sample_input=None if sample_input is None else (sample_input,),
                           input_names=input_names, output_names=output_names)

    def _step_schedulers(self, every_batch: bool) -> None:
        """Step the schedulers after each batch or each epoch (``step_schedulers_every_batch``)."""
        if every_batch == self.step_schedulers_every_batch:
            for scheduler in self.state.schedulers:
                scheduler.step()

    def _train_epoch(self) -> None:
        state = self.state
        self.engine.run_event(Event.EPOCH_START)
        sampler = getattr(state.train_dataloader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(int(state.timestamp.epoch))
        for batch in self._iter_train_batches():
            state.batch = batch
            self._train_batch()
            self.engine.run_event(Event.BATCH_END)
            if state.evaluators:
                self._eval_all(Event.BATCH_END)
            self.engine.run_event(Event.BATCH_CHECKPOINT)
            if self._preemption.requested():  # one all-reduce per batch with several ranks
                self._preemption.stop(self.state, self.logger, self.close)
            if self._run_plan.training_done(state) and not self._epoch_exhausted():
                break
        else:
            lap = self._wall_clock.lap(state, self.eval_interval)
            state.timestamp = state.timestamp.to_next_epoch(lap)
            if self._run_plan.log_at_epoch_end(state):  # log_interval in ep, a run in epochs
                self._log_train_metrics()
            self._step_schedulers(every_batch=False)
            self.engine.run_event(Event.EPOCH_END)
            self._eval_all(Event.EPOCH_END)
            self.engine.run_event(Event.EPOCH_CHECKPOINT)

    def _epoch_exhausted(self) -> bool:
        """Whether the last batch was the epoch's last (then the epoch ends normally)."""
        length = self.state.dataloader_len
        return length is not None and self.state.timestamp.batch_in_epoch >= length

    def _iter_train_batches(self) -> Iterator[Any]:
        """Yield device batches, firing BEFORE_DATALOADER / AFTER_DATALOADER around each fetch.

        With a sized dataloader exactly ``len`` fetches are made, so BEFORE_DATALOADER fires
        once per batch; an unsized one fires it once more at exhaustion.
        """
        state = self.state
        length = state.dataloader_len
        # the epoch's iterator; resumed mid-epoch, the rest of the checkpoint's epoch
        iterator, remaining = iter_epoch(state.train_dataloader, int(state.timestamp.epoch),
                                         int(state.timestamp.batch_in_epoch),
                                         None if length is None else int(length))
        spec = self._train_spec  # its transforms (the defaults skipped), then its counts
        while remaining is None or remaining > 0:
            self.engine.run_event(Event.BEFORE_DATALOADER)
            try:
                batch = next(iterator)
            except StopIteration:
                return
            batch = batch if spec.batch_transforms is no_transform else spec.batch_transforms(batch)
            state.batch = batch_to_device(batch, state.device)
            if spec.device_transforms is not no_transform:
                state.batch = spec.device_transforms(state.batch)
            host_tokens = self._num_tokens(spec, batch, state.batch)  # the model's: host copy
            # samples as loaded, before an algorithm prunes them (Composer's epoch: its loader's)
            self._batch_samples = int(spec.get_num_samples_in_batch(state.batch))
            # only algorithms change batches: one that reshaped it (SeqLengthWarmup,
            # SelectiveBackprop) has its tokens recounted on the device batch (a mask: a sync)
            shapes = tensor_shapes(state.batch) if state.algorithms else None
            self.engine.run_event(Event.AFTER_DATALOADER)
            if shapes is not None and tensor_shapes(state.batch) != shapes:
                host_tokens = self._num_tokens(spec, state.batch, state.batch)
            self._batch_tokens = host_tokens
            remaining = None if remaining is None else remaining - 1
            yield state.batch

    def _train_batch(self) -> None:
        """One optimizer step over ``state.batch``, accumulating gradients over microbatches."""
        state, engine = self.state, self.engine
        engine.run_event(Event.BATCH_START)
        batch = state.batch
        batch_size = (int(self._train_spec.get_num_samples_in_batch(batch)) if state.algorithms
                      else self._batch_samples)  # as loaded, unless an algorithm pruned it
        engine.run_event(Event.BEFORE_TRAIN_BATCH)
        if not state.model.training:  # train() walks every submodule (~0.5 ms for GPT-2 124M)
            state.model.train()
        self._weighting.begin_batch(batch, batch_size, state.device)  # tokens: one all-reduce
        num_tokens = self._batch_tokens
        stepped = self._weighting.has_loss_tokens  # False: every label -100, no step
        if stepped:
            self._weighting.note_stepped()
            gradients = functools.partial(self._batch_gradients, batch, batch_size)
            if uses_closure(state.optimizers):  # SAM: the optimizer runs forward-backward
                for optimizer in state.optimizers:
                    step_with_closure(optimizer, gradients, state.scaler)
            else:
                gradients()
                self._optimizer_step()
        else:
            skipped = self._weighting.note_skipped()
            log.warning("Batch %d has no loss token (every label is -100): its step is "
                        "skipped (%d batch%s skipped so far).", int(state.timestamp.batch) + 1,
                        skipped, "" if skipped == 1 else "es")
        world = state.parallel_dims.dp_size  # ranks with their own samples (a TP group shares one batch)
        state.previous_timestamp = state.timestamp
        state.timestamp = state.timestamp.to_next_batch(
            self._batch_samples * world, num_tokens * world,
            self._wall_clock.lap(state, self.eval_interval))
        if not stepped:
            return
        self._step_schedulers(every_batch=True)
        if self._run_plan.log_after_batch(state, int(state.timestamp.batch)):  # log_interval
            self._log_train_metrics()

    def _batch_gradients(self, batch: Any, batch_size: int, ddp_sync: bool = True,
                         loss_dict: Optional[dict[str, Any]] = None) -> torch.Tensor:
        """The batch's gradients, unscaled, then AFTER_TRAIN_BATCH; also an optimizer's
        closure (its arguments: :mod:`.closures`). Returns the batch's loss."""
        state = self.state
        with sync_context(state.model, ddp_sync):
            total_loss = self._forward_backward(batch, batch_size)
        state.batch = batch
        if loss_dict is None:
            state.total_loss = total_loss
        else:
            loss_dict["loss/train/total"] = total_loss
        scaler = state.scaler
        if scaler is not None:  # AFTER_TRAIN_BATCH sees true gradients (clipping)
            for optimizer in state.optimizers:
                scaler.unscale_(optimizer)
        self.engine.run_event(Event.AFTER_TRAIN_BATCH)
        return total_loss

    def _forward_backward(self, batch: Any, batch_size: int) -> torch.Tensor:
        """Gradients of ``batch`` over its microbatches; with ``'auto'`` microbatching, retried
        at half the microbatch size when any rank runs out of memory (:mod:`.auto_microbatch`);
        under a pipeline, through its schedule (:mod:`.pipeline_step`)."""
        if self._pipeline is not None:
            return self._pipeline.forward_backward(
                batch, self._train_spec, self._run_plan.precision_context(self.state))
        if self.state.auto_microbatching:
            return forward_backward_auto(self.state, batch_size,
                                         lambda size: self._accumulate(batch, size))
        return self._accumulate(batch, self.state.device_train_microbatch_size)

    def _accumulate(self, batch: Any, size: Optional[int]) -> torch.Tensor:
        """Gradients of ``batch`` in microbatches of ``size``, each loss weighted
        (:mod:`.loss_weighting`) and reduced (:mod:`.grad_sync`); returns the batch's loss."""
        state = self.state
        microbatches = list(self._train_spec.split_batch(batch, size)) if size else [batch]
        for optimizer in state.optimizers:
            optimizer.zero_grad(set_to_none=True)
        for metric in state.train_metrics.values():
            metric.reset()
        total_loss: Optional[torch.Tensor] = None  # no zeros() + add_ kernels per step
        for index, microbatch in enumerate(microbatches):
            with self._grad_sync.microbatch(last=index == len(microbatches) - 1):
                loss = self._train_microbatch(microbatch).float()  # no-op for fp32
                total_loss = loss if total_loss is None else total_loss + loss
        assert total_loss is not None  # split_batch yields at least one microbatch
        return total_loss

    def _train_microbatch(self, microbatch: Any) -> torch.Tensor:
        """Forward, loss (weighted by the microbatch's share of the batch) and backward."""
        state, engine = self.state, self.engine
        if self._train_spec.microbatch_transforms is not no_transform:  # a DataSpec's own
            microbatch = self._train_spec.microbatch_transforms(microbatch)
        state.batch = self._weighting.prepare(microbatch)  # + num_items_in_batch, if taken
        precision_context = self._run_plan.precision_context(state)  # built once per precision
        engine.run_event(Event.BEFORE_FORWARD)
        with precision_context:
            state.outputs = state.model(state.batch)
        engine.run_event(Event.AFTER_FORWARD)
        engine.run_event(Event.BEFORE_LOSS)
        with precision_context:
            state.loss = self._weighting.weigh(self._module.loss(state.outputs, state.batch),
                                               state.batch)
        engine.run_event(Event.AFTER_LOSS)
        if state.train_metrics:
            with torch.no_grad():
                for metric in state.train_metrics.values():
                    self._module.update_metric(state.batch, state.outputs, metric)
        state.outputs = None  # as in a plain loop, the outputs (logits) are not held in backward
        engine.run_event(Event.BEFORE_BACKWARD)
        loss = state.loss
        scaler = state.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()
        engine.run_event(Event.AFTER_BACKWARD)
        return state.loss.detach()

    def _num_tokens(self, spec: DataSpec, host_batch: Any, device_batch: Any) -> int:
        """The batch's tokens: the DataSpec's counter, else the model's ``num_tokens``."""
        return count_tokens(spec, host_batch, device_batch,
                            getattr(self._module, "num_tokens", None))

    def _optimizer_step(self) -> None:
        scaler = self.state.scaler
        for optimizer in self.state.optimizers:
            if scaler is not None:
                scaler.step(optimizer)
            else:
                optimizer.step()
        if scaler is not None:
            scaler.update()

    def _log_train_metrics(self) -> None:
        state = self.state
        # the batch's mean loss (per token with accumulate_train_batch_on_tokens)
        metrics: dict[str, Any] = {"loss/train/total": mean_over_ranks(state.total_loss)}
        if self._pipeline is not None:  # the last stage's states, on every rank
            self._pipeline.share_metric_states(state.train_metrics)
        for name, metric in state.train_metrics.items():
            metrics[f"metrics/train/{name}"] = metric.compute()
        state.total_loss_dict = {"loss/train/total": metrics["loss/train/total"]}  # Composer's
        state.train_metric_values = {name: metrics[f"metrics/train/{name}"]
                                     for name in state.train_metrics}
        self.logger.log_metrics(metrics)
        self._run_plan.last_logged_batch = int(state.timestamp.batch)

    # ------------------------------------------------------------------ eval
    def eval(self, eval_dataloader: Optional[EvalDataloader] = None,
             subset_num_batches: Optional[int] = -1) -> dict[str, float]:
        """Evaluate now (Composer's ``Trainer.eval``), on the Trainer's evaluators or, for this
        call only, on ``eval_dataloader`` (a dataloader, an Evaluator or a list of them).

        Fires ``EVAL_STANDALONE_START``, the eval events (``EVAL_BEFORE_ALL`` ...
        ``EVAL_AFTER_ALL``, which cadence's callbacks such as EMA hang on; Composer fires
        them inside ``fit`` only), then ``EVAL_STANDALONE_END``.

        Args:
            eval_dataloader: what to evaluate on instead of the Trainer's evaluators.
            subset_num_batches: batches per evaluator; ``-1`` (or None): each evaluator's
                ``subset_num_batches``, else the Trainer's ``eval_subset_num_batches``.

        Returns:
            ``{"metrics/<label>/<name>": value}`` for every evaluator's metrics.

        Raises:
            ValueError: no eval dataloader on the Trainer or here.
        """
        state = self.state
        kept_evaluators, kept_metrics = state.evaluators, dict(state.eval_metrics)
        if eval_dataloader is not None:
            state.evaluators = options.as_evaluators(eval_dataloader)
            self._align_eval_samplers()
            self._build_metrics()
        if not state.evaluators:
            raise ValueError("eval() needs an eval_dataloader (on the Trainer or passed here).")
        self.engine.run_event(Event.EVAL_STANDALONE_START)
        try:
            results = self._eval_all(subset_num_batches=subset_num_batches)
        finally:
            if eval_dataloader is not None:  # the Trainer's own evaluators are unchanged
                state.evaluators = kept_evaluators
                state.eval_metrics.update(kept_metrics)
        self.engine.run_event(Event.EVAL_STANDALONE_END)
        return results

    def _eval_all(self, event: Optional[Event] = None,
                  subset_num_batches: Optional[int] = -1) -> dict[str, float]:
        """Run the evaluators that are due after ``event`` (all of them when None)."""
        state = self.state
        due = [e for e in state.evaluators if event is None or eval_due(
            state, self.eval_interval if e.eval_interval is None
            else parse_eval_interval(e.eval_interval, f"Evaluator {e.label!r} eval_interval"),
            event)]
        if not due:
            return {}
        self.engine.run_event(Event.EVAL_BEFORE_ALL)
        results: dict[str, float] = {}
        # during fit, a preemption signal stops an evaluation at its next batch boundary
        stop = (lambda: self._preemption.requested() is not None) if event is not None \
            else None
        try:
            for evaluator in due:
                limit = subset_num_batches
                if limit is None or limit == -1:
                    limit = (self.eval_subset_num_batches if evaluator.subset_num_batches is None
                             else evaluator.subset_num_batches)
                results.update(self._eval_one(evaluator, int(limit), stop))
        except EvalInterrupted:  # save the batches trained, close, raise Preempted
            self._preemption.stop(self.state, self.logger, self.close)
        self.engine.run_event(Event.EVAL_AFTER_ALL)
        return results

    def _eval_one(self, evaluator: Evaluator, limit: int,
                  stop: Optional[Callable[[], bool]] = None) -> dict[str, float]:
        return evaluate(self.state, self.engine, self.logger, self._module, evaluator, limit,
                        stop, pipeline=self._forward_only)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Close every algorithm, callback and logger destination, release the save folder's
        lock, then the process groups cadence created (idempotent; see
        :func:`cadence.utils.dist.release_process_groups`): call it once the run is over."""
        self.engine.close()
        if self._run_folder is not None:  # a remote folder's logs uploaded, the lock released
            self._run_folder.close()
        dist.release_process_groups()  # before finalization, where gloo's threads can abort
