"""The launcher side of ``cadence launch``: SLURM's variables (:mod:`~cadence.launch.slurm`) and
the watch on ranks that died or hang (:mod:`~cadence.launch.rank_health`). Processes are
started by ``torch.distributed.run`` (torchrun); see :mod:`cadence.cli`."""

__all__: list[str] = []
