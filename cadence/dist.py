"""``cadence.dist``: the distributed helpers of :mod:`cadence.utils.dist`, importable as
``from cadence import dist`` or ``import cadence.dist``."""

from cadence.utils.dist import *  # noqa: F401,F403
from cadence.utils.dist import __all__  # noqa: F401
