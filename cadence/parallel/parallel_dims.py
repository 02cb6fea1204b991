"""``ParallelDims``: the one owner of a run's parallel degrees, its ``DeviceMesh`` and the
data-parallel group.

Everything that needs "how many ranks load different samples" (the per-device batch, the
samplers, the timestamp's global counts, token weighting, metric sums, the elastic-resume
check) asks this object instead of redoing the arithmetic from the config. The degrees are
read from the typed ``parallelism_config`` once and checked against the world size before
anything is built (a degree that does not divide the world is refused naming the key); the
mesh is built at most once, on first use, and the parallelize plan shards on that same mesh.

Mesh layout (outermost first; torchtitan's order): ``(pp, dp_replicate, dp_shard, tp)``,
with only the dimensions the run uses (see :func:`cadence.parallel.mesh.mesh_dims`); ``tp``
is innermost, so the ranks of one tensor-parallel group are neighbours on one node, and
``pp`` outermost, so this rank's data-parallel index is ``(global_rank // tp) % dp_size``
and its pipeline rank ``global_rank // (world_size / pp)``.

Expert parallelism (``parallelism_config.ep``) borrows its ranks from ``dp_shard``, as
torchtitan's does: ``ep`` divides ``dp_shard`` and does not multiply into the world size
(the ranks of one expert-parallel group still load different samples). With ``ep > 1``,
:meth:`ParallelDims.build_mesh` also builds the experts' mesh by unflattening the run
mesh's ``dp_shard`` dimension: ``(dp_replicate, dp_shard_in_ep, ep)``, ``ep`` innermost
(the ranks of one expert-parallel group are neighbours), ``dp_shard_in_ep = dp_shard /
ep`` the ranks holding the same experts, over which FSDP2 shards them (torchtitan's
"EP region" mesh and name). Everything that is not an expert is sharded over the run
mesh's data-parallel dimensions as without ``ep``.

Every process group the mesh creates times out after the run's ``dist_timeout``
(:func:`cadence.utils.dist.get_dist_timeout`), not torch's 30-minute default: a hung rank
fails FSDP2's, TP's and the metrics' collectives as it fails the default group's.

Source: torchtitan's ``ParallelDims`` (``torchtitan/distributed/parallel_dims.py``);
``torch.distributed.device_mesh.init_device_mesh`` and ``DeviceMesh._flatten``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from cadence.parallel.mesh import mesh_dims
from cadence.utils import dist

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    from cadence.parallel.config import ParallelismConfig

__all__ = ["ParallelDims", "build_mesh"]


@dataclass
class ParallelDims:
    """A run's parallel degrees on ``world_size`` ranks, and (built on first use) its mesh.

    Build it with :meth:`from_config`; the constructor takes the degrees as they are.

    Args:
        dp_replicate: data-parallel replicas (DDP, ``NO_SHARD``, HYBRID's outer dimension).
        dp_shard: ranks one FSDP2 shard group spans (1 without sharding).
        tp: tensor-parallel degree (ranks of one tensor-parallel group).
        world_size: all ranks; ``dp_replicate * dp_shard * tp * pp`` must equal it.
        global_rank: this rank.
        fsdp: whether FSDP2 shards the model (``parallelism_config.fsdp`` is set).
        pp: pipeline-parallel degree (1: no pipeline).
        ep: expert-parallel degree (1: no expert parallelism); borrowed from ``dp_shard``,
            which it must divide.
        mesh_shape / mesh_dim_names: the ``DeviceMesh`` the degrees make (empty when no
            mesh is needed: one process, or plain DDP).

    Raises:
        ValueError: the degrees do not multiply to ``world_size``, or ``ep`` does not
            divide ``dp_shard``.
    """

    dp_replicate: int
    dp_shard: int
    tp: int
    world_size: int
    global_rank: int = 0
    fsdp: bool = False
    pp: int = 1
    ep: int = 1
    mesh_shape: tuple[int, ...] = ()
    mesh_dim_names: tuple[str, ...] = ()
    _mesh: Optional[DeviceMesh] = field(default=None, repr=False, compare=False)
    _dp_group: Any = field(default=None, repr=False, compare=False)
    _expert_mesh: Optional[DeviceMesh] = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard", "tp", "pp", "ep", "world_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ParallelDims.{name} must be at least 1, got "
                                 f"{getattr(self, name)}.")
        product = self.dp_replicate * self.dp_shard * self.tp * self.pp
        if product != self.world_size:
            raise ValueError(
                f"dp_replicate ({self.dp_replicate}) x dp_shard ({self.dp_shard}) x tp "
                f"({self.tp}) x pp ({self.pp}) = {product} must equal the "
                f"world size ({self.world_size}).")
        if self.dp_shard % self.ep != 0:  # ep is borrowed from the shard ranks
            raise ValueError(
                f"parallelism_config.ep.expert_parallel_degree={self.ep} does not divide the "
                f"{self.dp_shard} data-parallel shard ranks (dp_shard); use a divisor of "
                f"{self.dp_shard}.")

    @classmethod
    def from_config(cls, config: Optional[ParallelismConfig] = None,
                    world_size: Optional[int] = None, local_world_size: Optional[int] = None,
                    global_rank: Optional[int] = None) -> ParallelDims:
        """The degrees ``config`` asks for on this job (or on ``world_size`` ranks).

        Args:
            config: the typed ``parallelism_config``; ``None``: DDP over every rank.
            world_size / local_world_size / global_rank: default this process's
                (:mod:`cadence.utils.dist`).

        Raises:
            ValueError: ``tensor_parallel_degree`` does not divide the world size or the
                ranks per node, tp without fsdp over more than one tp group, or fsdp degrees
                that do not fit (naming the key; :func:`cadence.parallel.mesh.mesh_dims`);
                ``expert_parallel_degree`` without fsdp, with tp, or not dividing the
                data-parallel shard ranks.
        """
        from cadence.parallel.config import ParallelismConfig

        config = config if config is not None else ParallelismConfig()
        world = dist.get_world_size() if world_size is None else int(world_size)
        local = dist.get_local_world_size() if local_world_size is None else int(local_world_size)
        rank = dist.get_global_rank() if global_rank is None else int(global_rank)
        shape, names = mesh_dims(config, world, local)
        sizes = dict(zip(names, shape))
        needs_mesh = config.fsdp is not None or config.tp_degree > 1 or config.pp_degree > 1
        _check_ep(config, sizes.get("dp_shard", 1))
        if needs_mesh and names[-1] == "tp" and not {"dp_replicate", "dp_shard"} & set(names):
            # tp alone (after pp): a size-1 data-parallel dimension (its groups: one rank)
            shape, names = (*shape[:-1], 1, shape[-1]), (*names[:-1], "dp_replicate", "tp")
        return cls(dp_replicate=sizes.get("dp_replicate", 1), dp_shard=sizes.get("dp_shard", 1),
                   tp=sizes.get("tp", 1), pp=sizes.get("pp", 1), world_size=world,
                   global_rank=rank,
                   fsdp=config.fsdp is not None, ep=config.ep_degree,
                   mesh_shape=tuple(shape) if needs_mesh else (),
                   mesh_dim_names=tuple(names) if needs_mesh else ())

    # ------------------------------------------------------------------ degrees
    @property
    def dp_size(self) -> int:
        """Ranks that load different samples: ``dp_replicate * dp_shard`` (the ranks of one
        tensor-parallel group load the same batch)."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel ranks: ``(global_rank // tp) % dp_size``
        (``tp`` is the innermost mesh dimension, its ranks share the index; ``pp`` the
        outermost, each stage's ranks count from 0)."""
        return (self.global_rank // self.tp) % self.dp_size

    @property
    def pp_enabled(self) -> bool:
        """Whether pipeline parallelism splits the model into stages (``pp > 1``)."""
        return self.pp > 1

    @property
    def pp_rank(self) -> int:
        """This rank's place in its pipeline: ``global_rank // (world_size / pp)``."""
        return self.global_rank // (self.world_size // self.pp)

    def pipeline_group(self) -> ProcessGroup:
        """The process group of this rank's pipeline (the ``pp`` mesh dimension: the ranks
        holding the other stages of the same samples).

        Raises:
            RuntimeError: no pipeline parallelism, or the mesh was not built yet.
        """
        if not self.pp_enabled or self._mesh is None:
            raise RuntimeError("ParallelDims.pipeline_group() needs pp > 1 and build_mesh().")
        return self._mesh["pp"].get_group()

    @property
    def tp_enabled(self) -> bool:
        """Whether tensor parallelism splits the model (``tp > 1``)."""
        return self.tp > 1

    @property
    def ep_enabled(self) -> bool:
        """Whether expert parallelism splits the MoE blocks' experts (``ep > 1``)."""
        return self.ep > 1

    @property
    def gradient_divide_factor(self) -> int:
        """What FSDP2 divides the experts' summed gradients by: every data-parallel rank
        (``dp_replicate * dp_shard``), not the smaller mesh they are sharded over: an
        expert's gradient already sums the tokens of the whole expert-parallel group
        (torchtitan's ``fsdp_gradient_divide_factor``)."""
        return self.dp_size

    @property
    def needs_mesh(self) -> bool:
        """Whether the run shards on a ``DeviceMesh`` (fsdp or tp set)."""
        return bool(self.mesh_dim_names)

    @property
    def uses_ddp(self) -> bool:
        """Whether the model is replicated with DDP: several data-parallel ranks, no fsdp."""
        return not self.fsdp and self.dp_size > 1

    # ------------------------------------------------------------------ mesh and groups
    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The run's ``DeviceMesh``, built once (a collective on first call: every rank calls
        it), its process groups timing out after the run's ``dist_timeout``.

        Raises:
            RuntimeError: the run needs no mesh (one process, or DDP).
        """
        if self._mesh is not None:
            return self._mesh
        if not self.needs_mesh:
            raise RuntimeError("This run's parallelism needs no DeviceMesh (no fsdp, tp or pp).")
        from torch.distributed.device_mesh import init_device_mesh

        override = _group_options()
        self._mesh = init_device_mesh(
            device_type, self.mesh_shape, mesh_dim_names=self.mesh_dim_names,
            backend_override=None if override is None else dict.fromkeys(
                range(len(self.mesh_shape)), override))
        if self.ep_enabled:  # the experts' mesh: dp_shard split into (dp_shard_in_ep, ep)
            names = ("dp_shard_in_ep", "ep")
            self._expert_mesh = self._mesh._unflatten(
                "dp_shard", (self.dp_shard // self.ep, self.ep), names,
                backend_override=None if override is None else dict.fromkeys(names, override))
        return self._mesh

    @property
    def expert_mesh(self) -> DeviceMesh:
        """The experts' mesh ``(dp_replicate, dp_shard_in_ep, ep)`` (``dp_replicate`` only
        with HYBRID strategies), built by :meth:`build_mesh`: experts are split over
        ``ep`` and FSDP2 shards them over the other dimensions
        (:meth:`expert_data_parallel_mesh`).

        Raises:
            RuntimeError: no expert parallelism, or the mesh was not built yet.
        """
        if self._expert_mesh is None:
            raise RuntimeError("No experts' mesh: expert parallelism is off (ep=1) or "
                               "ParallelDims.build_mesh() has not run yet.")
        return self._expert_mesh

    def expert_data_parallel_mesh(self) -> DeviceMesh:
        """The part of :attr:`expert_mesh` FSDP2 shards the experts over: ``dp_shard_in_ep``
        (with ``dp_replicate`` first under HYBRID strategies); its size may be 1."""
        mesh = self.expert_mesh
        names = tuple(n for n in (mesh.mesh_dim_names or ()) if n != "ep")
        return mesh[names] if len(names) > 1 else mesh[names[0]]

    @property
    def mesh(self) -> Optional[DeviceMesh]:
        """The mesh once :meth:`build_mesh` has run, else ``None``."""
        return self._mesh

    def data_parallel_group(self) -> Optional[ProcessGroup]:
        """The process group of this rank's data-parallel peers (the ranks holding the same
        tensor-parallel shard of different samples), over every data-parallel dimension:
        what metrics and token counts are summed over. Taken from the mesh (built by
        :meth:`build_mesh` before); ``None`` without tensor or pipeline parallelism,
        where the data-parallel ranks are the whole world (the default group).

        Raises:
            RuntimeError: tensor parallelism is on but the mesh was not built yet.
        """
        if not self.tp_enabled and not self.pp_enabled:
            return None
        if self._dp_group is None:
            if self._mesh is None:
                raise RuntimeError("ParallelDims.build_mesh() must run before the "
                                   "data-parallel group is read.")
            dp_names = tuple(n for n in self.mesh_dim_names if n in ("dp_replicate", "dp_shard"))
            dp_mesh = self._mesh[dp_names]
            if len(dp_names) > 1:
                override = _group_options()
                dp_mesh = dp_mesh._flatten("dp", backend_override=override)
            self._dp_group = dp_mesh.get_group()
        return self._dp_group

    def describe(self) -> str:
        """``"dp_replicate=1 dp_shard=4 tp=2 (8 ranks)"``: the degrees, for messages."""
        parts = [f"dp_replicate={self.dp_replicate}", f"dp_shard={self.dp_shard}",
                 f"tp={self.tp}"]
        parts += [f"{name}={getattr(self, name)}" for name in ("pp", "ep")
                  if getattr(self, name) > 1]
        return f"{' '.join(parts)} ({self.world_size} ranks)"


def _check_ep(config: ParallelismConfig, dp_shard: int) -> None:
    """Refuse an ``expert_parallel_degree`` the run cannot take (before anything is built).

    Raises:
        ValueError: ep without fsdp, ep with tensor or pipeline parallelism, or ep not dividing the
            ``dp_shard`` data-parallel shard ranks (naming the key and the fix).
    """
    ep = config.ep_degree
    if ep == 1:
        return
    key = f"parallelism_config.ep.expert_parallel_degree={ep}"
    if config.fsdp is None:
        raise ValueError(f"{key} needs parallelism_config.fsdp: the experts are split over "
                         f"ranks taken from FSDP2's shard ranks, and FSDP2 shards everything "
                         f"else; add fsdp: {{}}.")
    if config.pp_degree > 1:
        raise ValueError(f"{key} with pipeline parallelism "
                         f"(pipeline_parallel_degree={config.pp_degree}) is not supported yet; "
                         f"use one of them.")
    if config.tp_degree > 1:
        raise ValueError(f"{key} with tensor parallelism "
                         f"(tensor_parallel_degree={config.tp_degree}) is not supported yet; "
                         f"use one of them.")
    if config.fsdp.sharding_strategy == "NO_SHARD" or dp_shard % ep != 0:
        raise ValueError(f"{key} does not divide the {dp_shard} data-parallel shard ranks "
                         f"(dp_shard, with sharding_strategy "
                         f"{config.fsdp.sharding_strategy}): expert-parallel ranks are taken "
                         f"from them; use a divisor of {dp_shard}.")


def build_mesh(config: ParallelismConfig, device_type: str) -> DeviceMesh:
    """The ``DeviceMesh`` for ``config`` (needs an initialised process group): a new
    :class:`ParallelDims`'s mesh. A Trainer builds its mesh once, through
    ``state.parallel_dims``, instead."""
    return ParallelDims.from_config(config).build_mesh(device_type)


def _group_options() -> Optional[tuple[str, Any]]:
    """``(backend, options)`` giving a new mesh group the run's ``dist_timeout`` (gloo and
    NCCL); ``None`` (torch's defaults) for another or a mixed backend."""
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized():
        return None
    backend = str(torch_dist.get_backend())
    if backend == "gloo":
        options = torch_dist.ProcessGroupGloo._Options()
    elif backend == "nccl" and hasattr(torch_dist, "ProcessGroupNCCL"):
        options = torch_dist.ProcessGroupNCCL.Options()
    else:
        return None
    options._timeout = dist.get_dist_timeout()
    return backend, options
