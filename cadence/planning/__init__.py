"""``cadence plan``: a run's memory, collectives and step time on a cluster that does not
exist yet, found by applying the real parallelize plan to fake ranks
(:mod:`~cadence.planning.simulate`) and reading PyTorch's memory tracker.

Names are imported on first use (:mod:`cadence._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.planning.devices import DEVICES, Device, get_device
    from cadence.planning.planner import Plan, plan_config, plan_run
    from cadence.planning.simulate import RankMemory, StepSpec, simulate_rank

__all__ = ["DEVICES", "Device", "get_device", "Plan", "plan_run", "plan_config",
           "RankMemory", "StepSpec", "simulate_rank"]

_devices, _planner, _simulate = ("cadence.planning.devices", "cadence.planning.planner",
                                 "cadence.planning.simulate")
__getattr__, __dir__ = lazy_exports(__name__, {
    "DEVICES": _devices, "Device": _devices, "get_device": _devices,
    "Plan": _planner, "plan_run": _planner, "plan_config": _planner,
    "RankMemory": _simulate, "StepSpec": _simulate, "simulate_rank": _simulate,
})
