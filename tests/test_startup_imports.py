"""First contact stays light (issue 15): ``cadence --help`` imports no torch, ``import cadence``
imports none of the heavy packages, every lazily exported name still resolves, and a schema
error in a run file (a typo in a key, a registry name or an argument, a wrong type, a bad
Time string or enum value) is reported before torch or any component module is imported.

Each check runs in a fresh interpreter and reads its ``sys.modules``: what a fresh process
imported, not how long it took (timings are in ``benchmarks/startup.py``).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cadence.config.registry_index import load_index

ROOT = Path(__file__).resolve().parent.parent

#: What ``import cadence`` must leave unimported (issue 15, item 3).
HEAVY = ("torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint",
         "transformers", "torchmetrics", "wandb", "omegaconf")

#: Packages whose ``__init__`` re-exports lazily; importing one must not import ``HEAVY``.
LAZY_PACKAGES = ("cadence", "cadence.algorithms", "cadence.callbacks", "cadence.metrics",
                 "cadence.models", "cadence.models.tasks", "cadence.trainer",
                 "cadence.checkpoint", "cadence.core", "cadence.parallel", "cadence.loggers",
                 "cadence.optim", "cadence.utils", "cadence.devices", "cadence.config",
                 "cadence.launch")


def imported_after(code: str) -> set[str]:
    """The names in ``sys.modules`` after running ``code`` in a fresh interpreter.

    ``code`` may raise ``SystemExit`` (as ``--help`` does); stdout is discarded.
    """
    probe = (
        "import io, json, sys\n"
        "out, sys.stdout = sys.stdout, io.StringIO()\n"
        "try:\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + "except SystemExit:\n"
        "    pass\n"
        "sys.stdout = out\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def heavy_in(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    """The entries of ``packages`` (or their submodules) that are in ``modules``."""
    return sorted(p for p in packages
                  if any(m == p or m.startswith(p + ".") for m in modules))


def run_cli(argv: list[str], status: int = 0) -> tuple[set[str], str]:
    """Run ``cadence ARGV`` (``cadence.cli.main``) in a fresh interpreter in the repository
    root; return the names in its ``sys.modules`` when it returned, and its stderr.

    ``sys.modules`` rather than ``-X importtime``: importtime leaves out some modules that
    are imported (``cadence.models.gpt`` when the registry imports it), which would make an
    absence check blind.
    """
    probe = ("import io, json, sys\n"
             "from cadence.cli import main\n"
             "out, sys.stdout = sys.stdout, io.StringIO()\n"
             f"status = main({argv!r})\n"
             "sys.stdout = out\n"
             "print(json.dumps([status, sorted(sys.modules)]))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    returned, modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert returned == status, proc.stderr[-2000:]
    return set(modules), proc.stderr


def imported_by_cli(argv: list[str], status: int = 0) -> set[str]:
    """The modules a fresh ``python -m cadence ARGV`` process imports."""
    return run_cli(argv, status)[0]


def component_modules() -> set[str]:
    """The module of every component in the registry index (cadence's and torch's)."""
    return {spec["target"].rpartition(".")[0]
            for specs in load_index().values() for spec in specs.values()}


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["launch", "--help"],
                                  ["convert", "--help"], ["plot", "--help"], []])
def test_cli_help_imports_no_torch(argv: list[str]) -> None:
    modules = imported_by_cli(argv, status=0 if argv else 2)  # no command: usage, status 2
    assert {"cadence.cli", "argparse"} <= modules  # the listing is complete enough to trust
    assert heavy_in(modules, ("torch", "transformers", "numpy")) == []


def test_the_check_sees_torch_when_it_is_imported() -> None:
    # The probe is not blind: `convert` needs the checkpoint code, which imports torch.
    modules = imported_by_cli(["convert", "no-such-checkpoint", "--to", "full", "out.pt"], 1)
    assert "torch" in modules


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_import_package_leaves_heavy_packages_unimported(package: str) -> None:
    modules = imported_after(f"import {package}")
    assert package in modules
    assert heavy_in(modules, HEAVY) == []


def test_import_cadence_imports_no_torch() -> None:
    assert heavy_in(imported_after("import cadence"), ("torch",)) == []


def test_first_use_imports_the_defining_module() -> None:
    modules = imported_after("import cadence\ncadence.State")
    assert "cadence.core.state" in modules and "torch" in modules
    assert "cadence.trainer.trainer" not in modules  # only what the name needs
    modules = imported_after("import cadence\ncadence.Event")  # core re-exports lazily too
    assert "cadence.core.event" in modules and "torch" not in modules


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_exported_name_resolves_and_is_listed(package: str) -> None:
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'NotAName'"):
        getattr(module, "NotAName")


def test_lazy_names_are_the_defining_objects() -> None:
    import cadence
    from cadence import Trainer, dist
    from cadence.core.time import Time
    from cadence.utils.dist import get_world_size
    from cadence.trainer.trainer import Trainer as DefiningTrainer

    assert Trainer is DefiningTrainer and cadence.Time is Time
    assert dist.get_world_size is get_world_size and cadence.dist is dist


@pytest.mark.parametrize("package", ["cadence.algorithms", "cadence.callbacks",
                                     "cadence.loggers"])
def test_registry_imports_every_module_that_registers(package: str) -> None:
    # Lazy packages register nothing on import; the registry imports their
    # _REGISTERING_MODULES. A new module with a @register decorator must be listed there.
    from pathlib import Path

    module = importlib.import_module(package)
    root = Path(module.__file__).parent

    def name(path: Path) -> str:  # algorithms/<name>/<name>.py: Composer's module paths
        parts = path.relative_to(root).with_suffix("").parts
        return ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))

    registering = {name(path) for path in root.rglob("*.py") if ".register(" in path.read_text()}
    assert registering and registering == set(module._REGISTERING_MODULES)


def test_registry_lists_lazily_imported_components_in_a_fresh_interpreter() -> None:
    code = ("from cadence.registry import registry\n"
            "print(registry.algorithms.names(), registry.callbacks.names())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    for name in ("gradient_clipping", "ema", "speed_monitor", "lr_monitor", "nan_monitor"):
        assert f"'{name}'" in out


def test_startup_benchmark_prints_its_table() -> None:
    # One trial of the two cheap rows: the script runs and its table has the rows asked for
    # (no timing is asserted; the figures are in docs/benchmarks.md).
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "startup.py"
    proc = subprocess.run([sys.executable, str(script), "--trials", "1", "--only",
                           "import,help", "--markdown"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ['python -c "import cadence"',
                                                    "cadence --help"]
    assert all(float(row.split("|")[2]) > 0 for row in rows)
    bad = subprocess.run([sys.executable, str(script), "--only", "nope"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "unknown --only keys ['nope']" in bad.stderr


#: ``cadence train yamls/quickstart.yaml OVERRIDE``: a schema error and what stderr must say.
SCHEMA_ERRORS = [
    ("max_duraton=1ba", "max_duraton: unknown key. Did you mean 'max_duration'?"),
    ("model.name=gtp2", "model.name: Unknown model 'gtp2'. Did you mean 'gpt2'?"),
    ("model.n_layr=2", "model.n_layr: unknown argument for model 'gpt2' "
                       "(cadence.models.gpt.gpt2). Did you mean 'n_layer'?"),
    ("model.n_layer=two", "model.n_layer: 'two' (str) is not an int."),
    ("max_duration=3epochs", "max_duration: Invalid time string '3epochs'"),
    ("precision=fp33", "precision: 'fp33' (str) is not one of: fp32, amp_bf16, amp_fp16. Did "
                       "you mean 'fp32'?"),
    ("optimizer.betas=[0.9]", "optimizer.betas: [0.9] (list) has 1 item; expected a list of "
                              "exactly 2 values (a float, a float)"),
    ("callbacks.speed_monitr={}", "callbacks.speed_monitr: Unknown callback 'speed_monitr'. "
                                  "Did you mean 'speed_monitor'?"),
    ("compile_config.mdoe=default", "compile_config.mdoe: unknown key. Did you mean 'mode'? "
                                    "Allowed: enabled, mode, fullgraph, dynamic, backend, "
                                    "per_block."),
    ("parallelism_config.tp.layer_plan={attn: colwse}",
     "parallelism_config.tp.layer_plan.attn: 'colwse' is not a style. Did you mean 'colwise'?"),
    ("parallelism_config.fsdp.shardin_strategy=FULL_SHARD",
     "parallelism_config.fsdp.shardin_strategy: unknown FSDP key. Did you mean "
     "'sharding_strategy'?"),
]


@pytest.mark.parametrize("override,message", SCHEMA_ERRORS, ids=[c[0] for c in SCHEMA_ERRORS])
def test_schema_error_imports_no_torch_and_no_component(override: str, message: str) -> None:
    modules, err = run_cli(["train", "yamls/quickstart.yaml", override], status=2)
    assert "cadence.config.schema" in modules  # the listing is complete enough to trust
    assert f"cadence train: 1 problem in run config yamls/quickstart.yaml:\n  - {message}" in err
    assert f"(set by override {override!r})" in err
    assert heavy_in(modules, ("torch", "transformers", "torchmetrics", "numpy")) == []
    assert component_modules() & modules == set()
    assert "cadence.models.gpt" in component_modules()  # the forbidden set is not empty


def test_launch_reports_a_schema_error_before_torchrun() -> None:
    # torchrun is torch.distributed.run: with no torch imported, no rank was started.
    modules, err = run_cli(["launch", "-n", "2", "yamls/quickstart.yaml", "max_duraton=1ba"],
                           status=2)
    assert err.count("Did you mean 'max_duration'?") == 1
    assert err.startswith("cadence launch: 1 problem in run config yamls/quickstart.yaml:")
    assert heavy_in(modules, ("torch", "transformers")) == []
    assert component_modules() & modules == set()


def test_value_error_is_found_by_the_second_stage_before_anything_is_built() -> None:
    # A missing checkpoint is no schema error: the components are imported (torch with
    # them) and the values checked, and the run stops before the Trainer is even imported.
    modules, err = run_cli(["train", "yamls/quickstart.yaml", "load_path=/nonexistent/ep1.pt"],
                           status=2)
    assert "load_path: '/nonexistent/ep1.pt' does not exist" in err
    assert "torch" in modules and "cadence.models.gpt" in modules
    assert "cadence.trainer.trainer" not in modules and "cadence.config.build" not in modules


def test_dotted_path_tp_style_is_imported_by_the_second_stage() -> None:
    # the first stage cannot import a layer_plan's dotted path without torch: it passes it on
    modules, err = run_cli(["train", "yamls/quickstart.yaml",
                            "parallelism_config.tp.layer_plan={attn: mypkg.Nope}"], status=2)
    assert ("parallelism_config.tp.layer_plan.attn: cannot import 'mypkg.Nope' (No module named "
            "'mypkg')") in err
    assert "torch" in modules and "cadence.trainer.trainer" not in modules


def test_dotted_path_to_user_code_is_checked_by_the_second_stage() -> None:
    # The index cannot know user code: its arguments are checked once it is imported.
    modules, err = run_cli(["train", "yamls/quickstart.yaml",
                            "model={name: tests.common.models.SimpleModel, in_featurs: 2}"],
                           status=2)
    assert ("model.in_featurs: unknown argument for model 'tests.common.models.SimpleModel' "
            "(tests.common.models.SimpleModel). Did you mean 'in_features'?") in err
    assert "tests.common.models" in modules
