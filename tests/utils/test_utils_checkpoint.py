"""``cadence.utils.checkpoint``: Composer's ``save_checkpoint(state, filename)`` and
``load_checkpoint(path, state, logger, ...)`` write and read real cadence checkpoints: a
trained Trainer's state comes back bit for bit in a fresh one, ``load_weights_only`` leaves
the optimizer fresh, and a flipped byte is refused."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Trainer, dist
from cadence.checkpoint import CheckpointError
from cadence.parallel.config import FSDPConfig, ParallelismConfig
from cadence.utils import checkpoint as composer_ckpt
from cadence.utils.checkpoint import (
    checkpoint_format,
    load_checkpoint,
    save_checkpoint,
    translate_ignore_keys,
)
from tests.common.models import SimpleModel, make_dataloader

RUN = "utilsckpt"


def make_trainer(seed: int = 1, **kwargs: Any) -> Trainer:
    torch.manual_seed(seed)
    data = make_dataloader(num_batches=2, batch_size=4).dataset
    loader = DataLoader(data, batch_size=4 // dist.get_world_size(),
                        sampler=dist.get_sampler(data, shuffle=False))
    return Trainer(model=SimpleModel(), train_dataloader=loader, max_duration="2ba",
                   progress_bar=False, run_name=RUN, seed=seed, **kwargs)


def trained(**kwargs: Any) -> Trainer:
    trainer = make_trainer(**kwargs)
    trainer.fit()
    return trainer


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.state.model.state_dict().items()}


def optimizer_tensors(trainer: Trainer) -> list[torch.Tensor]:
    state = trainer.state.optimizers[0].state_dict()["state"]
    return [v for per_param in state.values() for v in per_param.values()
            if isinstance(v, torch.Tensor)]


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_save_with_composer_signature_then_load_into_a_fresh_trainer(tmp_path: Path) -> None:
    source = trained()
    optim_before = optimizer_tensors(source)
    assert optim_before  # SGD/Adam state exists after two steps, or momentum buffers
    rng_at_save = torch.get_rng_state()
    template = tmp_path / "{run_name}" / "ep{epoch}-ba{batch}-rank{rank}"
    path = save_checkpoint(source.state, str(template))
    assert path == str(tmp_path / RUN / "ep1-ba2-rank0")  # Composer's name: no suffix added
    assert Path(path).is_file()

    fresh = make_trainer(seed=7)
    assert any(not torch.equal(a, b) for a, b in zip(weights(fresh).values(),
                                                      weights(source).values()))
    torch.manual_seed(123)  # the load puts the checkpoint's RNG back
    rng = load_checkpoint(path, fresh.state, fresh.logger)
    assert_bit_equal(weights(fresh), weights(source))
    after = optimizer_tensors(fresh)
    assert len(after) == len(optim_before)
    assert all(torch.equal(a, b) for a, b in zip(after, optim_before))
    assert fresh.state.timestamp.batch == 2 and fresh.state.timestamp.epoch == 1
    # Composer returns the RNG states indexed by rank; cadence has already restored them
    assert isinstance(rng, list) and len(rng) == dist.get_world_size()
    assert torch.equal(rng[0]["torch"], rng_at_save)
    assert torch.equal(torch.get_rng_state(), rng_at_save)


def test_load_weights_only_leaves_the_optimizer_and_time_fresh(tmp_path: Path) -> None:
    source = trained()
    path = save_checkpoint(source.state, str(tmp_path / "w.pt"))
    fresh = make_trainer(seed=7)
    assert optimizer_tensors(fresh) == []
    assert load_checkpoint(path, fresh.state, fresh.logger, load_weights_only=True) is None
    assert_bit_equal(weights(fresh), weights(source))
    assert optimizer_tensors(fresh) == []  # nothing loaded into it
    assert int(fresh.state.timestamp.batch) == 0


def test_weights_only_checkpoint_loads_with_load_weights_only(tmp_path: Path) -> None:
    source = trained()
    path = save_checkpoint(source.state, str(tmp_path / "m"), weights_only=True)
    fresh = make_trainer(seed=7)
    load_checkpoint(str(path), fresh.state, fresh.logger, load_weights_only=True)
    assert_bit_equal(weights(fresh), weights(source))


def test_a_flipped_byte_is_refused(tmp_path: Path) -> None:
    source = trained()
    path = Path(save_checkpoint(source.state, str(tmp_path / "ok.pt")))  # type: ignore[arg-type]
    data = bytearray(path.read_bytes())
    tensor = weights(source)["net.0.weight"].numpy().tobytes()
    at = bytes(data).find(tensor[:64])  # inside the first layer's weight
    assert at > 0
    data[at + 8] ^= 0x01  # one bit of one byte
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    fresh = make_trainer(seed=7)
    before = weights(fresh)
    with pytest.raises(CheckpointError, match="CRC32C"):
        load_checkpoint(str(bad), fresh.state, fresh.logger)
    assert_bit_equal(weights(fresh), before)  # nothing was loaded


def test_filename_fields_and_unknown_field(tmp_path: Path) -> None:
    source = trained()
    path = save_checkpoint(
        source.state, str(tmp_path / "{run_name}-s{sample}-bie{batch_in_epoch}-ws{world_size}"))
    assert path == str(tmp_path / f"{RUN}-s8-bie0-ws1")
    with pytest.raises(ValueError, match=r"unknown field 'step'.*\{batch\}"):
        save_checkpoint(source.state, str(tmp_path / "x{step}"))


def test_save_ignore_keys_leave_parts_out_and_a_url_is_refused(tmp_path: Path) -> None:
    state = make_trainer().state
    path = save_checkpoint(state, str(tmp_path / "c.pt"),
                           ignore_keys=["state/optimizers", "state/model/net.2.*"])
    saved = torch.load(path, weights_only=True)["state"]
    assert "optimizers" not in saved and "schedulers" in saved
    assert "net.0.weight" in saved["model"]
    assert not any(k.startswith("net.2.") for k in saved["model"])
    path = save_checkpoint(state, str(tmp_path / "d.pt"),
                           ignore_keys=lambda sd: sd["state"].pop("callbacks"))
    assert "callbacks" not in torch.load(path, weights_only=True)["state"]
    with pytest.raises(ValueError, match="save_folder"):
        save_checkpoint(state, "s3://bucket/ckpt/ep{epoch}")


def test_sharded_format_follows_the_run_and_round_trips(tmp_path: Path) -> None:
    source = trained(save_folder=str(tmp_path / "run"), save_interval="1ep",
                     save_state_dict_type="sharded")
    assert checkpoint_format(source.state) == "sharded"
    path = save_checkpoint(source.state, str(tmp_path / "sharded-ba{batch}"))
    assert path == str(tmp_path / "sharded-ba2") and Path(path).is_dir()
    fresh = make_trainer(seed=7)
    load_checkpoint(path, fresh.state, fresh.logger)
    assert_bit_equal(weights(fresh), weights(source))
    source.close()


def test_format_choice_from_the_fsdp_config() -> None:
    state = make_trainer().state
    assert checkpoint_format(state) == "full"
    state.parallelism_config = {"fsdp": {"state_dict_type": "sharded"}}
    assert checkpoint_format(state) == "sharded"
    state.parallelism_config = ParallelismConfig(fsdp=FSDPConfig(state_dict_type="full"))
    assert checkpoint_format(state) == "full"
    state.parallelism_config = ParallelismConfig(fsdp=FSDPConfig())
    assert checkpoint_format(state) == "sharded"


def test_ignore_keys_in_composer_spelling(tmp_path: Path) -> None:
    source = trained()
    path = save_checkpoint(source.state, str(tmp_path / "c.pt"))
    fresh = make_trainer(seed=7)
    kept = weights(fresh)
    rng = load_checkpoint(path, fresh.state, fresh.logger,
                          ignore_keys=["state/model/net.2.*", "state/optimizers",
                                       "state/train_metrics/*", "rng"])
    assert rng is None  # rng ignored, as Composer
    now, saved = weights(fresh), weights(source)
    assert torch.equal(now["net.0.weight"], saved["net.0.weight"])
    assert torch.equal(now["net.2.weight"], kept["net.2.weight"])  # skipped
    assert optimizer_tensors(fresh) == []
    assert fresh.state.timestamp.batch == 2


def test_translate_ignore_keys() -> None:
    assert translate_ignore_keys(["state/model", "state/optimizers/*", "rng", "schedulers",
                                  "state/dataset_state", "state/rank_zero_seed",
                                  "algorithms/EMA", "*"]) == [
        "model/*", "optimizers", "rng", "schedulers", "data", "algorithms/EMA", "*"]
    with pytest.raises(ValueError, match="only as a whole"):
        translate_ignore_keys(["state/optimizers/Adam/state"])
    with pytest.raises(TypeError, match="glob patterns"):
        translate_ignore_keys(lambda sd: None)  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match="names no part"):
        assert translate_ignore_keys(["state/whatever"]) == ["whatever"]


class FolderStore:
    """Composer's ``ObjectStore`` interface over a local folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.downloads: list[str] = []

    def download_object(self, object_name: str, filename: str, overwrite: bool = False,
                        callback: Any = None) -> None:
        self.downloads.append(object_name)
        shutil.copyfile(self.root / object_name, filename)


def test_load_from_an_object_store_and_a_run_name_field(tmp_path: Path) -> None:
    source = trained()
    save_checkpoint(source.state, str(tmp_path / "bucket" / "ckpts" / "{run_name}.pt"))
    store = FolderStore(tmp_path / "bucket")
    fresh = make_trainer(seed=7)
    load_checkpoint("ckpts/{run_name}.pt", fresh.state, fresh.logger, object_store=store,
                    progress_bar=False, exclude_algorithms=["BlurPool"], algorithm_passes=[])
    assert store.downloads == [f"ckpts/{RUN}.pt"]
    assert_bit_equal(weights(fresh), weights(source))
    with pytest.raises(CheckpointError, match="Cannot download checkpoint 'ckpts/missing.pt'"):
        load_checkpoint("ckpts/missing.pt", fresh.state, fresh.logger, object_store=store)


def test_composer_names_are_exported() -> None:
    import cadence.utils as utils

    assert utils.save_checkpoint is save_checkpoint and utils.load_checkpoint is load_checkpoint
    assert utils.checkpoint is composer_ckpt


@pytest.mark.world_size(2)
def test_two_ranks_full_and_sharded(tmp_path: Path) -> None:
    """``full``: rank 0 writes and returns the path, rank 1 gets None (as Composer);
    ``sharded``: every rank writes its part and gets the directory. Both load on two ranks."""
    source = trained()
    full = save_checkpoint(source.state, str(tmp_path / "full-rank{rank}"))
    assert full == (str(tmp_path / "full-rank0") if dist.get_global_rank() == 0 else None)
    source.state.parallelism_config = {"fsdp": {"state_dict_type": "sharded"}}
    sharded = save_checkpoint(source.state, str(tmp_path / "sharded"))
    assert sharded == str(tmp_path / "sharded")
    for path in (str(tmp_path / "full-rank{rank}"), sharded):
        fresh = make_trainer(seed=7)
        rng = load_checkpoint(path, fresh.state, fresh.logger)
        assert_bit_equal(weights(fresh), weights(source))
        assert rng is not None and len(rng) == 2


def test_get_save_filename_and_download_checkpoint(tmp_path: Path) -> None:
    from cadence.utils.checkpoint import download_checkpoint, get_save_filename

    source = trained()
    assert get_save_filename(source.state) == "ep1-ba2-rank0"
    assert get_save_filename(source.state, "{run_name}/b{batch}.pt") == f"{RUN}/b2.pt"
    path = save_checkpoint(source.state, str(tmp_path / "bucket" / "ckpts" / "c.pt"))
    # a local path is copied; a name in an object store is downloaded (the store's API)
    local, folder, extracted = download_checkpoint(path, str(tmp_path / "node"), None, False)
    assert (folder, extracted) == (None, False)
    assert Path(local).read_bytes() == Path(path).read_bytes()
    store = FolderStore(tmp_path / "bucket")
    got, _, _ = download_checkpoint("ckpts/c.pt", str(tmp_path / "node2"), store, True)
    assert store.downloads == ["ckpts/c.pt"] and Path(got).read_bytes() == Path(path).read_bytes()
    fresh = make_trainer(seed=7)
    load_checkpoint(got, fresh.state, fresh.logger)
    assert_bit_equal(weights(fresh), weights(source))
    with pytest.raises(TypeError, match="load_object_store"):
        download_checkpoint("c.pt", str(tmp_path / "n3"), object(), False)
