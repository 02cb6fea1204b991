"""``cadence.dist``: the distributed helpers of :mod:`cadence.trainer.dist`, importable as
``from cadence import dist`` or ``import cadence.dist``."""

from cadence.trainer.dist import *  # noqa: F401,F403
from cadence.trainer.dist import __all__  # noqa: F401
