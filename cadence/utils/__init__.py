"""Small utilities shared across cadence."""

from cadence.utils.interval import create_interval_scheduler
from cadence.utils.precision import bf16_supported
from cadence.utils.reproducibility import seed_all

__all__ = ["bf16_supported", "create_interval_scheduler", "seed_all"]
