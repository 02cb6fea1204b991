"""``cadence.utils.dist``: Composer's ``composer.utils.dist`` path for the distributed
helpers of :mod:`cadence.trainer.dist` (where they live; also ``cadence.dist``)."""

from __future__ import annotations

from cadence.trainer.dist import *  # noqa: F401,F403
from cadence.trainer.dist import __all__  # noqa: F401
