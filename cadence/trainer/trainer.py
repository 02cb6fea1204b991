"""The :class:`Trainer`: wiring in ``__init__``, then ``fit`` and ``eval`` as loops of small
named steps. The order of events is documented on :class:`~cadence.Event`.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import torch

from cadence.utils.device import get_device
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
                                     tensor_shapes)
from cadence.optim.optimizers import compile_scheduler, trainable_parameters
from cadence.parallel import (
    ParallelPlan, data_parallel_rank, data_parallel_size, parallelize, parse_parallelism_config,
    remap_optimizer_params, unwrap_model,
)
from cadence.parallel.compile import parse_compile_config
from cadence.parallel.elastic import check_resume_layout
from cadence.parallel.data import (
    align_sampler_with_data_parallel, check_distributed_sampler,
)
from cadence.parallel.mesh import data_parallel_group
from cadence.core.precision import Precision, get_precision_context
from cadence.trainer.eval_loop import evaluate
from cadence.trainer.predict import predict_loop
from cadence.profiler.profiler import bind_profilers
from cadence.trainer.preemption import DEFAULT_SIGNALS, Preemption
from cadence.utils.precision import check_precision
from cadence.utils.reproducibility import seed_all

__all__ = ["Trainer"]

log = logging.getLogger(__name__)

class Trainer:
    """Trains a :class:`~cadence.ComposerModel`, firing events for algorithms and callbacks.

    Args:
        model: the model to train.
        train_dataloader: yields training batches (tensor, dict or tuple, samples first), or
            a :class:`~cadence.DataSpec` (its transforms, splitting and counters are used).
        max_duration: how long :meth:`fit` trains, e.g. ``"2ep"``, ``"1000ba"``, ``"1e6tok"``.
        eval_dataloader: a dataloader (labelled ``eval``), an :class:`~cadence.Evaluator`, or
            a list of Evaluators.
        eval_interval: how often to evaluate during ``fit`` (``"1ep"``, ``"500ba"``,
            ``"0.25dur"``; an int means epochs). The model is also evaluated when training ends.
        eval_subset_num_batches: eval batches per evaluation; ``-1`` for all.
        optimizers: an optimizer (or a one-element list); default ``AdamW(lr=1e-3)`` on the
            model's parameters, built after ``INIT`` so it sees any model surgery.
        schedulers: :class:`~cadence.optim.optimizers.ComposerScheduler` s or torch
            ``LRScheduler`` s, stepped once per batch.
        device_train_microbatch_size: samples per forward/backward; the batch's gradients
            are accumulated over microbatches and equal the full-batch gradient (each
            microbatch loss is weighted by its share of the batch's samples, or tokens with
            ``accumulate_train_batch_on_tokens``). ``None``: the whole batch at once.
            ``'auto'``: the whole batch, halved (on every rank together) when a batch runs
            out of memory or, on CUDA, makes the allocator retry (:mod:`.auto_microbatch`).
        accumulate_train_batch_on_tokens: weight each microbatch's loss by its share of the
            global batch's loss tokens (labels not ``-100``, from the model's
            ``num_loss_tokens``), counted over microbatches and data-parallel ranks, so the
            step is the batch's mean per-token loss (Composer's; default False: samples;
            :mod:`cadence.trainer.loss_weighting`).
        precision: ``fp32`` (default), ``amp_bf16`` or ``amp_fp16``; ``amp_bf16`` is refused
            on a GPU without native bf16 (:func:`~cadence.utils.precision.check_precision`).
        seed: seeds ``random``, NumPy and torch with ``seed + global rank``; default: a random
            seed, kept in ``state.rank_zero_seed`` and logged.
        algorithms: :class:`~cadence.Algorithm` s, run in this order (reversed on ``AFTER_*``).
        algorithm_passes: extra ordering passes for the algorithms (Composer's argument): a
            function ``(algorithms, event) -> algorithms``, a ``(pass, index)`` pair, or a
            list of these; see :mod:`cadence.core.passes`.
        callbacks: :class:`~cadence.Callback` s.
        loggers: :class:`~cadence.loggers.LoggerDestination` s.
        run_name: names the run in logs and paths; default ``run-<unix time>``.
        device: ``"cpu"``, ``"cuda"`` or None (CUDA when available, else CPU).
        dist_timeout: seconds a collective may wait for the other ranks before it fails
            (Composer's name; default 600), set on the process group. A rank that stops
            answering (hung, ``SIGSTOP``) then ends the job with an error naming it, instead
            of hanging it forever.
        progress_bar: add a progress destination (a tqdm bar on a terminal, plain lines in
            logs) unless ``loggers`` already has one.
        log_interval: how often the training loss is logged (``"10ba"``; an int means batches),
            and on the first batch.
            The loss stays on the device between logs: no host sync per step.
        save_folder: where run artifacts go (metrics, later checkpoints); ``{run_name}`` in it
            is filled in. The file logger writes there unless given its own folder. An
            fsspec URL (``s3://bucket/runs/{run_name}``) saves to object storage through a
            local stage (:mod:`~cadence.checkpoint.remote`; ``state.save_folder`` is
            then the stage, and the logs are uploaded at each save and at ``close()``).
        hyperparameters: logged once through every logger destination (e.g. the YAML config).
        parallelism_config: ``{"fsdp": {...}, "tp": {...}}`` or a parsed
            :class:`~cadence.parallel.ParallelismConfig` (see
            :mod:`cadence.config.parallelism`): ``fsdp`` shards the model with FSDP2,
            ``tp`` adds tensor parallelism (the ranks of a tp group load the same batches);
            without it, a run of several ranks uses DDP.
        compile_config: ``torch.compile`` per transformer block (or the whole model), a dict
            or a :class:`~cadence.parallel.compile.CompileConfig`; applied by the
            parallelize plan after activation checkpointing and before TP and sharding; see
            :mod:`cadence.parallel.plan`. Default: no compile.
        save_filename, save_interval, save_num_checkpoints_to_keep, save_overwrite,
        save_weights_only, save_latest_filename, save_ignore_keys: checkpointing into
            ``save_folder`` (a :class:`~cadence.callbacks.CheckpointSaver` is added when
            ``save_folder`` is set and ``save_interval`` is not None); see that class for
            each. Names default to Composer's: ``ep{epoch}-ba{batch}-rank{rank}.pt`` (a
            sharded checkpoint: the folder ``ep{epoch}-ba{batch}``) and the symlink
            ``latest-rank{rank}.pt``; the file holds Composer's layout
            (:mod:`~cadence.checkpoint.layout`).
        save_metrics: also save the train and eval metrics' state in each checkpoint
            (Composer's ``train_metrics`` / ``eval_metrics``), restored on load. Default False.
        save_state_dict_type: ``full`` or ``sharded``; default ``full``, or the fsdp config's
            ``state_dict_type`` (``sharded``) in an FSDP run.
        save_async: write checkpoints in a background thread; the loop waits only while the
            state is copied to CPU memory (see ``CheckpointSaver``'s ``save_async``). Default
            False.
        save_allow_nonfinite: save states with NaN/inf loss or weights as ordinary checkpoints
            (default False: written aside as ``*.nonfinite``, the run stops naming the batch).
        load_path: a checkpoint to start from (a ``.pt`` file or a sharded directory, or
            its URL: ``s3://bucket/runs/x/ep1-ba8``); a ``.pt`` written by Composer 0.32
            resumes too (model, optimizer, schedulers, timestamp, RNG).
        load_object_store: ``load_path`` is a name in this store: an fsspec URL, an
            ``ObjectStore`` or a ``RemoteUploaderDownloader``
            (:mod:`~cadence.checkpoint.object_store`).
        load_weights_only: take only the model's weights from ``load_path``.
        load_strict_model_weights: the model's keys must match the checkpoint's (else an
            error before training); shapes must match either way.
        load_ignore_keys: glob patterns of what not to load (e.g. ``model/model.score.*``,
            ``optimizers``, ``rng``); see :func:`~cadence.checkpoint.load_checkpoint`.
        autoresume: continue from the newest complete checkpoint of this ``run_name`` in
            ``save_folder`` (bit-exact on the same world size), else start fresh (or from
            ``load_path``). Needs ``save_folder`` and an explicit ``run_name``.
        require_checksums: refuse a checkpoint without checksums (default True).
        train_dataloader_label, train_subset_num_batches, scale_schedule_ratio,
        step_schedulers_every_batch, log_to_console, console_stream, console_log_interval,
        log_traces, auto_log_hparams, profiler: Composer's (see
        :mod:`cadence.trainer.trainer_options`):
            the train dataloader's label; batches per epoch (``-1``: all); a factor on
            ``max_duration`` and the schedulers; step schedulers per batch (default: per
            batch unless a torch ``LRScheduler`` is given, then per epoch); a plain console
            logger every ``console_log_interval`` (default ``log_interval``) to
            ``console_stream`` (``'stdout'``, ``'stderr'``, the default, or a stream), beside
            a progress bar only on a terminal; print algorithm traces there; log the Trainer's
            arguments as hyperparameters; a :class:`~cadence.profiler.Profiler` (bound to
            ``state.profiler``; the Engine then records event durations). ``device`` also takes
            ``'gpu'`` and a :class:`~cadence.devices.Device`; ``eval_interval`` also takes a
            callable ``(state, event) -> bool``; ``run_name`` defaults to
            ``$CADENCE_RUN_NAME``, ``$COMPOSER_RUN_NAME`` or ``$RUN_NAME``.
        load_exclude_algorithms: class names of algorithms whose saved state is not loaded
            (Composer's); ``load_progress_bar`` and ``spin_dataloaders`` are accepted and
            have no effect (no download bar; a resumed run continues its dataloader from the
            saved position instead of spinning through it).
        precision_config: Composer's FP8 settings; must be unset (no FP8 in cadence).
        deterministic_mode: deterministic kernels only
            (:func:`~cadence.utils.reproducibility.configure_deterministic_mode`).
        ddp_sync_strategy: DDP gradient sync over microbatches: ``single_auto_sync``
            (default: the last microbatch only) or ``multi_auto_sync`` (every microbatch).
        python_log_level: the ``cadence`` logger's level (``"info"``, ``"debug"``...).
        preemption_signals, preemption_timeout, requeue: on one of these signals (default
            ``SIGTERM``, ``SIGUSR1``; ``()``: off) ``fit`` checkpoints at the next batch, closes
            the Trainer and raises ``Preempted``, all within ``preemption_timeout`` seconds;
            ``requeue``: ``scontrol requeue`` under SLURM (:mod:`cadence.trainer.preemption`).

    Raises:
        ValueError / TypeError: for bad arguments, naming the argument and the fix, before any
            event fires.
        SaveFolderInUse: another live run holds ``save_folder`` (its lock file
            ``cadence.lock`` names the run's host, PID and start time); see
            :mod:`cadence.checkpoint.lock`.
    """

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
        load_ignore_keys: Sequence[str] = (),
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
        log_interval: TimeLike = "10ba",
        hyperparameters: Optional[Mapping[str, Any]] = None,
        save_state_dict_type: Optional[str] = None,
        save_async: bool = False,
        save_allow_nonfinite: bool = False,
        require_checksums: bool = True,
        preemption_signals: Any = DEFAULT_SIGNALS, preemption_timeout: float = 90.0,
        requeue: bool = False,
    ) -> None:
        init_args = dict(locals()) if auto_log_hparams else {}
        ddp_sync_strategy = options.apply_run_settings(python_log_level, deterministic_mode,
                                                       precision_config, ddp_sync_strategy)
        load_ignore_keys = [*load_ignore_keys,
                            *options.excluded_algorithm_keys(load_exclude_algorithms)]
        del spin_dataloaders, load_progress_bar  # accepted: resume continues the dataloader
        options.check_model(model)
        # a DataSpec (Composer's) or a plain dataloader; the state holds the dataloader itself
        self._train_spec = None if train_dataloader is None else ensure_data_spec(train_dataloader)
        train_dataloader = None if self._train_spec is None else self._train_spec.dataloader
        self._auto_microbatch, device_train_microbatch_size = parse_microbatch_size(
            device_train_microbatch_size)  # 'auto': None, the batch size at the first batch
        if len(as_list(optimizers)) > 1:
            raise ValueError("Only one optimizer is supported; put parameter groups in one optimizer.")
        self.eval_interval = parse_eval_interval(eval_interval)
        self.scale_schedule_ratio = float(scale_schedule_ratio)
        self.train_dataloader_label = train_dataloader_label
        self.step_schedulers_every_batch = options.steps_schedulers_every_batch(
            as_list(schedulers), step_schedulers_every_batch)
        self.log_interval = Time.from_input(log_interval, TimeUnit.BATCH)
        self.eval_subset_num_batches = int(options.checked_eval_subset(eval_subset_num_batches))
        self.parallelism_config = parse_parallelism_config(parallelism_config)
        self.compile_config = parse_compile_config(compile_config, prefix="compile_config")
        device_obj = get_device(device).torch_device  # 'cpu', 'gpu', 'cuda:1', a Device
        check_precision(precision, device_obj)  # amp_bf16 where bf16 is native only
        self._on_tokens = bool(accumulate_train_batch_on_tokens)
        self._preemption = Preemption(preemption_signals, preemption_timeout, requeue)
        self._wall_clock = WallClock()  # the timestamp's *_wct clocks
        dist.initialize_dist(device_obj, timeout=dist_timeout)
        # data-parallel ranks load (and seed) apart; the ranks of one tensor-parallel group alike
        self._dp_size = data_parallel_size(self.parallelism_config)
        self._dp_rank = data_parallel_rank(self.parallelism_config)
        check_distributed_sampler(train_dataloader, "train_dataloader", self._dp_size)
        align_sampler_with_data_parallel(train_dataloader, "train_dataloader", self._dp_size,
                                         self._dp_rank)
        run_name, rank_zero_seed = options.run_name_and_seed(run_name, seed, autoresume,
                                                             save_folder)
        seed_all(rank_zero_seed)  # INIT's surgery draws the same new weights on every rank
        # a URL (s3://...) saves to object storage through a local stage; an unknown protocol
        # or a missing extra (of save_folder or load_path) is refused now
        self._run_folder = RunFolder.of(save_folder, run_name)
        if load_path is not None and load_object_store is None:
            check_url(load_path)
        check_object_store(load_object_store)

        self.state = State(
            model=model,
            rank_zero_seed=rank_zero_seed,
            optimizers=optimizers,  # a user's optimizer follows INIT's model surgery
            run_name=run_name,
            save_folder=None if self._run_folder is None else str(self._run_folder.local),
            device=device_obj,
            max_duration=options.scale_duration(options.parse_duration(max_duration),
                                                scale_schedule_ratio),
            precision=Precision.parse(precision).value,
            device_train_microbatch_size=device_train_microbatch_size,
            save_metrics=save_metrics,
            train_dataloader=train_dataloader,
            dataloader_label=train_dataloader_label if train_dataloader is not None else None,
            dataloader_len=options.subset_len(options.dataloader_len(train_dataloader),
                                              train_subset_num_batches),
            evaluators=options.as_evaluators(eval_dataloader),
            algorithms=as_list(algorithms),
            callbacks=as_list(callbacks) + options.profiler_callbacks(profiler),
        )
        bind_profilers(self.state)  # a Profiler: state.profiler, its profilers and handlers
        # one run per save folder (rank 0 locks it; released by close() or at exit)
        if self._run_folder is not None:  # (and a remote folder's logs are fetched)
            self._run_folder.lock(run_name)
        destinations = as_list(loggers)
        destinations += options.console_destinations(
            destinations, progress_bar, log_to_console, console_stream,
            console_log_interval or self.log_interval, log_traces)
        self.hyperparameters = {**options.extract_hparams(init_args), **(hyperparameters or {})}
        self.hyperparameters.setdefault("rank_zero_seed", rank_zero_seed)
        add_run_saver(
            self.state, self._run_folder, self._checkpoint_metadata(), self.parallelism_config,
            save_interval=options.checked_save_interval(save_interval), filename=save_filename,
            latest_filename=save_latest_filename,
            num_checkpoints_to_keep=save_num_checkpoints_to_keep, overwrite=save_overwrite,
            weights_only=save_weights_only, state_dict_type=save_state_dict_type,
            autoresume=autoresume, save_async=save_async, allow_nonfinite=save_allow_nonfinite,
            ignore_keys=save_ignore_keys)
        self.logger = Logger(self.state, destinations)
        if isinstance(model, ComposerModel):
            model.logger = self.logger  # Composer's ComposerModel.logger
        self.engine = Engine(self.state, self.logger, algorithm_passes, destinations=destinations)

        self.engine.run_event(Event.INIT)
        seed_all(rank_zero_seed + self._dp_rank)  # then each data-parallel rank its own stream
        self._parallelize(as_list(optimizers))
        self._weighting = LossWeighting(self._module, self._on_tokens, self._dp_size,
                                        self._metric_group)  # the data-parallel group
        self._grad_sync = GradientSync(self.state.model, self.parallelism_config.fsdp,
                                       ddp_sync_strategy)
        self._build_optimizers(as_list(optimizers), as_list(schedulers))
        self._build_metrics()
        self.engine.run_event(Event.BEFORE_LOAD)
        loaded = load_at_start(  # autoresume or load_path; a remote one downloaded, then removed
            self.state, self._run_folder, pointer_name(save_latest_filename, run_name),
            load_path, autoresume, weights_only=load_weights_only,
            strict=load_strict_model_weights, ignore_keys=load_ignore_keys,
            require_checksums=require_checksums, check_layout=lambda local: check_resume_layout(
                local, self.state, self.parallelism_config, load_ignore_keys),
            object_store=load_object_store)
        if loaded is not None:  # which checkpoint this run started from, in every destination
            self.hyperparameters["loaded_checkpoint"] = loaded
        self.engine.run_event(Event.AFTER_LOAD)
        self.logger.log_hyperparameters(self.hyperparameters)

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
        plan = ParallelPlan(self.parallelism_config, self.compile_config, state.device,
                            state.precision, seed=state.rank_zero_seed)
        state.model = parallelize(module, plan)
        self._module = unwrap_model(state.model)
        # metrics sum over the data-parallel ranks (a TP group shares its samples)
        self._metric_group = data_parallel_group(self.parallelism_config)
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
        self.grad_scaler = options.grad_scaler_for(state.precision, state.device)

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
        self._wall_clock.start()  # timestamp.total_wct counts from here
        self.engine.run_event(Event.FIT_START)
        with self._preemption.watch(state):  # a signal: checkpoint, close, raise Preempted
            while not self._training_done():
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
            self._auto_microbatch = changes.auto_microbatch
        if changes.precision is not None:
            self.grad_scaler = options.grad_scaler_for(self.state.precision, self.state.device)

    def predict(self, dataloader: Union[Iterable[Any], DataSpec], subset_num_batches: int = -1, *,
                return_outputs: bool = True) -> list[Any]:
        """The model's outputs on every batch of ``dataloader`` (Composer's
        ``Trainer.predict``, firing the ``PREDICT_*`` events; see
        :func:`~cadence.trainer.predict.predict_loop`).

        Returns:
            The outputs of each batch, on the CPU, when ``return_outputs``; else ``[]``.
        """
        spec = ensure_data_spec(dataloader)  # a DataSpec's transforms run too
        return predict_loop(self.state, self.engine, spec.dataloader, subset_num_batches,
                            return_outputs, data_spec=spec)

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

    def _training_done(self) -> bool:
        state = self.state
        assert state.max_duration is not None
        return state.stop_training or state.reached(state.max_duration)

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
            self._eval_all(Event.BATCH_END)
            self.engine.run_event(Event.BATCH_CHECKPOINT)
            if self._preemption.requested():  # one all-reduce per batch with several ranks
                self._preemption.stop(self.state, self.logger, self.close)
            if self._training_done() and not self._epoch_exhausted():
                break
        else:
            lap = self._wall_clock.lap(state, self.eval_interval)
            state.timestamp = state.timestamp.to_next_epoch(lap)
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
        while remaining is None or remaining > 0:
            self.engine.run_event(Event.BEFORE_DATALOADER)
            try:
                batch = next(iterator)
            except StopIteration:
                return
            spec = self._train_spec  # its transforms, then its (or the model's) count
            batch = spec.batch_transforms(batch)
            state.batch = spec.device_transforms(batch_to_device(batch, state.device))
            host_tokens = self._num_tokens(spec, batch, state.batch)  # the model's: host copy
            shapes = tensor_shapes(state.batch)
            # the timestamp counts the samples loaded, before an algorithm prunes the batch
            # (SelectiveBackprop), as Composer does: an epoch is its loader's samples
            self._batch_samples = int(spec.get_num_samples_in_batch(state.batch))
            self.engine.run_event(Event.AFTER_DATALOADER)
            # an algorithm that reshaped the batch (SeqLengthWarmup, SelectiveBackprop) changed
            # its real tokens: recount the device batch then only (a sync only with a mask)
            self._batch_tokens = (host_tokens if tensor_shapes(state.batch) == shapes
                                  else self._num_tokens(spec, state.batch, state.batch))
            remaining = None if remaining is None else remaining - 1
            yield state.batch

    def _train_batch(self) -> None:
        """One optimizer step over ``state.batch``, accumulating gradients over microbatches."""
        state, engine = self.state, self.engine
        engine.run_event(Event.BATCH_START)
        batch = state.batch
        batch_size = int(self._train_spec.get_num_samples_in_batch(batch))
        engine.run_event(Event.BEFORE_TRAIN_BATCH)
        if not state.model.training:  # train() walks every submodule (~0.5 ms for GPT-2 124M)
            state.model.train()
        self._weighting.begin_batch(batch, batch_size, state.device)  # tokens: one all-reduce
        num_tokens = self._batch_tokens
        gradients = functools.partial(self._batch_gradients, batch, batch_size)
        if uses_closure(state.optimizers):  # SAM: the optimizer calls forward-backward itself
            for optimizer in state.optimizers:
                step_with_closure(optimizer, gradients, self.grad_scaler)
        else:
            gradients()
            self._optimizer_step()
        world = self._dp_size  # ranks with their own samples (a TP group shares one batch)
        state.previous_timestamp = state.timestamp
        state.timestamp = state.timestamp.to_next_batch(
            self._batch_samples * world, num_tokens * world,
            self._wall_clock.lap(state, self.eval_interval))
        self._step_schedulers(every_batch=True)
        step = int(state.timestamp.batch)
        if step == 1 or step % self.log_interval.value == 0 or self._training_done():
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
        if self.grad_scaler is not None:  # AFTER_TRAIN_BATCH sees true gradients (clipping)
            for optimizer in state.optimizers:
                self.grad_scaler.unscale_(optimizer)
        self.engine.run_event(Event.AFTER_TRAIN_BATCH)
        return total_loss

    def _forward_backward(self, batch: Any, batch_size: int) -> torch.Tensor:
        """Gradients of ``batch`` over its microbatches; with ``'auto'`` microbatching, retried
        at half the microbatch size when any rank runs out of memory (:mod:`.auto_microbatch`)."""
        if self._auto_microbatch:
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
        microbatch = self._train_spec.microbatch_transforms(microbatch)  # a DataSpec's
        state.batch = self._weighting.prepare(microbatch)  # + num_items_in_batch, if taken
        engine.run_event(Event.BEFORE_FORWARD)
        with get_precision_context(Precision(state.precision), device=state.device):
            state.outputs = state.model(state.batch)
        engine.run_event(Event.AFTER_FORWARD)
        engine.run_event(Event.BEFORE_LOSS)
        with get_precision_context(Precision(state.precision), device=state.device):
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
        (self.grad_scaler.scale(loss) if self.grad_scaler else loss).backward()
        engine.run_event(Event.AFTER_BACKWARD)
        return state.loss.detach()

    def _num_tokens(self, spec: DataSpec, host_batch: Any, device_batch: Any) -> int:
        """The batch's tokens: the DataSpec's counter, else the model's ``num_tokens``."""
        return count_tokens(spec, host_batch, device_batch,
                            getattr(self._module, "num_tokens", None))

    def _optimizer_step(self) -> None:
        for optimizer in self.state.optimizers:
            if self.grad_scaler is not None:
                self.grad_scaler.step(optimizer)
            else:
                optimizer.step()
        if self.grad_scaler is not None:
            self.grad_scaler.update()

    def _log_train_metrics(self) -> None:
        state = self.state
        # the batch's mean loss (per token with accumulate_train_batch_on_tokens)
        metrics: dict[str, Any] = {"loss/train/total": mean_over_ranks(state.total_loss)}
        for name, metric in state.train_metrics.items():
            metrics[f"metrics/train/{name}"] = metric.compute()
        self.logger.log_metrics(metrics)

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
        for evaluator in due:
            limit = subset_num_batches
            if limit is None or limit == -1:
                limit = (self.eval_subset_num_batches if evaluator.subset_num_batches is None
                         else evaluator.subset_num_batches)
            results.update(self._eval_one(evaluator, int(limit)))
        self.engine.run_event(Event.EVAL_AFTER_ALL)
        return results

    def _eval_one(self, evaluator: Evaluator, limit: int) -> dict[str, float]:
        return evaluate(self.state, self.engine, self.logger, self._module, evaluator, limit)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Close every algorithm, callback and logger destination, release the save folder's
        lock, then the process groups cadence created (idempotent; see
        :func:`cadence.utils.dist.release_process_groups`): call it once the run is over."""
        self.engine.close()
        if self._run_folder is not None:  # a remote folder's logs uploaded, the lock released
            self._run_folder.close()
        dist.release_process_groups()  # before finalization, where gloo's threads can abort
