"""``parallelism_config.pp``: pipeline parallelism's settings, typed and checked
(:class:`PPConfig`). Torch-free, like the rest of ``parallelism_config``'s first stage.

``pp: {pipeline_parallel_degree, schedule, microbatch_size | num_microbatches, split_points,
stages_per_rank}``; the run is built by :mod:`cadence.parallel.pipeline`.

Schedules (``torch.distributed.pipelining``), with the stages each rank holds:

=========================  ========================  ===================================
schedule                   stages_per_rank           stage ``s`` on pipeline rank
=========================  ========================  ===================================
``GPipe``, ``1F1B``        1                         ``s``
``Interleaved1F1B``,       any (default 2)           ``s % pipeline_parallel_degree``
``LoopedBFS``,                                       (looped)
``InterleavedZeroBubble``
``ZBVZeroBubble``,         2                         ``r`` and ``2 p - 1 - r`` (V-shaped:
``DualPipeV``                                        rank 0 holds the first and last stage)
=========================  ========================  ===================================

Source: torchtitan's ``[parallelism]`` pipeline keys (``torchtitan/config/job_config.py``)
and ``torch.distributed.pipelining.schedules.get_schedule_class``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional

from cadence.registry.errors import ConfigError, ConfigProblem, did_you_mean

__all__ = ["PPConfig", "PP_SCHEDULES", "SINGLE_STAGE_SCHEDULES", "V_SCHEDULES", "pp_values"]

PP_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                "ZBVZeroBubble", "DualPipeV")
"""``pp.schedule`` values: the seven schedules of ``torch.distributed.pipelining``."""
SINGLE_STAGE_SCHEDULES = ("GPipe", "1F1B")
"""Schedules that run exactly one stage per rank."""
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
"""Schedules that run exactly two stages per rank, placed in a V."""

_PREFIX = "parallelism_config.pp"


@dataclass
class PPConfig:
    """Pipeline parallelism (``parallelism_config.pp``); see :mod:`cadence.parallel.pipeline`.

    Attributes:
        pipeline_parallel_degree: pipeline ranks (the outermost ``pp`` mesh dimension: ranks
            ``0 .. W/p - 1`` hold stage 0, the next ``W/p`` stage 1, ...); must divide the
            world size. Default 1: no pipeline.
        schedule: one of :data:`PP_SCHEDULES` (case-insensitive); default ``1F1B``.
        microbatch_size: samples per pipeline microbatch; the rank's batch must be a multiple.
        num_microbatches: microbatches per batch (the rank's batch must divide into them).
            At most one of the two; neither: the Trainer's ``device_train_microbatch_size``
            when it is an int, else one microbatch per stage (``p * stages_per_rank``).
        split_points: module names where a stage begins (``model.transformer.h.2``: stage 1
            starts at block 2), ``p * stages_per_rank - 1`` of them in model order; default
            the blocks split evenly (the first stages take one more when they do not divide).
        stages_per_rank: stages each rank runs; default 1 for ``GPipe`` / ``1F1B``, 2 for the
            others. ``GPipe`` / ``1F1B`` take 1 only, ``ZBVZeroBubble`` / ``DualPipeV`` 2 only.

    Raises:
        ConfigError: an unknown key, a value of the wrong type or out of range, both
            microbatch keys, a ``stages_per_rank`` the schedule cannot run, or a number of
            ``split_points`` that does not make the stages; each naming its key.
    """

    pipeline_parallel_degree: int = 1
    schedule: str = "1F1B"
    microbatch_size: Optional[int] = None
    num_microbatches: Optional[int] = None
    split_points: Optional[list[str]] = None
    stages_per_rank: Optional[int] = None

    def __post_init__(self) -> None:
        """Check the settings (the run file's checks) and store the canonical spelling
        (``gpipe`` -> ``GPipe``) and the resolved ``stages_per_rank``."""
        problems: list[tuple[str, str]] = []
        raw = {f.name: getattr(self, f.name) for f in fields(self)
               if getattr(self, f.name) != f.default}
        values = pp_values(raw, _PREFIX, problems)
        if problems:
            raise ConfigError([ConfigProblem(key, message) for key, message in problems])
        for key, value in values.items():
            setattr(self, key, value)
        if self.stages_per_rank is None:
            self.stages_per_rank = 1 if self.schedule in SINGLE_STAGE_SCHEDULES else 2

    @property
    def num_stages(self) -> int:
        """Stages in the whole pipeline: ``pipeline_parallel_degree * stages_per_rank``."""
        return self.pipeline_parallel_degree * int(self.stages_per_rank or 1)

    def microbatches_for(self, batch_size: int,
                         device_train_microbatch_size: Optional[int] = None) -> int:
        """The microbatches a rank's batch of ``batch_size`` samples is cut into:
        ``num_microbatches``; else ``batch_size / microbatch_size`` (or
        ``device_train_microbatch_size`` when ``microbatch_size`` is unset); else one per
        stage. The Trainer's pipeline step and ``cadence plan`` both count with it.

        Raises:
            ValueError: the batch does not split evenly into the microbatches; fewer
                microbatches than pipeline ranks; or, for the interleaved (non-V,
                multi-stage) schedules, a number that is not a multiple of them.
        """
        if self.num_microbatches is not None:
            count, how = self.num_microbatches, f"{_PREFIX}.num_microbatches"
        else:
            size = self.microbatch_size or device_train_microbatch_size
            if size is not None:
                how = (f"{_PREFIX}.microbatch_size" if self.microbatch_size
                       else "device_train_microbatch_size")
                count = batch_size // size if batch_size % size == 0 else 0
            else:
                count, how = self.num_stages, "one microbatch per stage (the default)"
        if count < 1 or batch_size % count != 0:
            raise ValueError(f"{_PREFIX}: the rank's batch of {batch_size} samples does not "
                             f"split evenly into microbatches ({how}); use a batch size that "
                             f"does (and drop_last=True).")
        self.check_num_microbatches(count)
        return count

    def check_num_microbatches(self, num_microbatches: int) -> None:
        """Refuse a number of microbatches the schedule cannot run.

        Raises:
            ValueError: fewer than ``pipeline_parallel_degree``, or (interleaved schedules
                other than the V ones) not a multiple of it.
        """
        pp = self.pipeline_parallel_degree
        if num_microbatches < pp:
            raise ValueError(f"{_PREFIX}: {num_microbatches} microbatch(es) cannot fill {pp} "
                             f"pipeline ranks; use at least {pp} (num_microbatches, or a "
                             f"smaller microbatch_size).")
        if (self.schedule not in SINGLE_STAGE_SCHEDULES and self.schedule not in V_SCHEDULES
                and num_microbatches % pp != 0):
            raise ValueError(f"{_PREFIX}: {self.schedule} needs a number of microbatches that "
                             f"is a multiple of pipeline_parallel_degree={pp}; got "
                             f"{num_microbatches}.")


def _positive(problems: list[tuple[str, str]], key: str, value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append((key, f"{value!r} must be a positive int."))
        return None
    return value


def pp_values(raw: Mapping[str, Any], prefix: str,
              problems: list[tuple[str, str]]) -> dict[str, Any]:
    """The one check of pipeline settings (run file and :meth:`PPConfig.__post_init__`): the
    valid values of ``raw`` by field name, canonically spelled; problems appended as
    ``(full key path, message)``."""
    names = [f.name for f in fields(PPConfig)]
    values: dict[str, Any] = {}
    for raw_key, value in raw.items():
        key, where = str(raw_key), f"{prefix}.{raw_key}"
        if key not in names:
            problems.append((where, f"unknown pipeline key.{did_you_mean(key, names)} "
                                    f"Allowed: {', '.join(names)}."))
        elif key == "schedule":
            match = [s for s in PP_SCHEDULES if str(value).lower() == s.lower()]
            if not match:
                problems.append((where, f"{value!r} is not one of: {', '.join(PP_SCHEDULES)}."
                                        f"{did_you_mean(str(value), PP_SCHEDULES, True)}"))
            else:
                values[key] = match[0]
        elif key == "split_points":
            if value is None:
                continue
            if isinstance(value, str):
                value = [value]
            if (not isinstance(value, (list, tuple)) or not value
                    or not all(isinstance(v, str) and v for v in value)):
                problems.append((where, f"{value!r} must be a non-empty list of module names "
                                        "(e.g. [model.transformer.h.2])."))
            elif len(set(value)) != len(value):
                problems.append((where, f"{list(value)} names a module twice."))
            else:
                values[key] = list(value)
        elif value is None and key in ("microbatch_size", "num_microbatches",
                                       "stages_per_rank"):
            continue
        else:
            number = _positive(problems, where, value)
            if number is not None:
                values[key] = number
    if "microbatch_size" in values and "num_microbatches" in values:
        problems.append((f"{prefix}.num_microbatches", "set microbatch_size or "
                         "num_microbatches, not both."))
    schedule = values.get("schedule", None if "schedule" in raw else "1F1B")  # None: bad
    per_rank = values.get("stages_per_rank")
    if per_rank is not None and schedule in SINGLE_STAGE_SCHEDULES and per_rank != 1:
        problems.append((f"{prefix}.stages_per_rank", f"{per_rank}: {schedule} runs one stage "
                         "per rank; use Interleaved1F1B, LoopedBFS or InterleavedZeroBubble "
                         "for several."))
    if per_rank is not None and schedule in V_SCHEDULES and per_rank != 2:
        problems.append((f"{prefix}.stages_per_rank", f"{per_rank}: {schedule} runs exactly "
                         "two stages per rank (a V); set 2 or leave it out."))
    points = values.get("split_points")
    if points is not None and "pipeline_parallel_degree" in values and schedule is not None:
        default = 1 if schedule in SINGLE_STAGE_SCHEDULES else 2
        stages = values["pipeline_parallel_degree"] * (per_rank or default)
        if len(points) != stages - 1:
            problems.append((f"{prefix}.split_points", f"{len(points)} split point(s) make "
                             f"{len(points) + 1} stages, but pipeline_parallel_degree x "
                             f"stages_per_rank = {stages}; give {stages - 1}."))
    return values
