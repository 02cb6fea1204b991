"""Composer 0.32.1's examples and its docs' code blocks, renamed ``composer`` -> ``cadence``,
each run in its own subprocess against cadence (issue 34). On demand, not in CI::

    python tools/composer_examples.py --composer-repo PATH_TO_COMPOSER_GIT [--work DIR]
        [--timeout 300] [--only NAME ...] [--list]

``PATH_TO_COMPOSER_GIT`` has the tag ``v0.32.1``. The virtualenv and the renamed ``tests/``
(the docs' fixtures import ``tests.common``) are ``tools/composer_suite.py``'s, in the same
``--work`` (default ``~/.cache/cadence/compat/composer-0.32.1``); ``pytorch-lightning`` (the
``migrate_from_ptl`` notebook imports it) is added to that virtualenv without dependencies.

**Examples** (:data:`EXAMPLES`, 14): ``examples/*.ipynb`` and ``examples/*.py`` less the TPU
and SLURM notebooks (Composer's own notebook test skips them too). A notebook's code cells are
joined into one script; IPython lines (``%pip``, ``%%time``, ``!``) are dropped. Each script
starts with ``composer_standins.install()`` (offline stand-ins for CIFAR-10, MNIST, the Hub's
BERT/ELECTRA and the GLUE/AG News data sets: see that module) and has the substitutions
of :data:`SHRINK` and :data:`EXAMPLE_EDITS` applied (epochs above 2 -> ``'2ep'``, big batch
sizes -> 64), so that each trains a few batches.

**Docs blocks** (61): on the pages of ``docs/source`` that hold ``testcode``/``doctest``
blocks (the ones Sphinx's doctest runs), every ``testcode``, ``doctest`` and Python
``code``/``code-block`` block. Each runs as Sphinx's doctest would: after Composer's
``doctest_fixtures.py`` (its Hugging Face part dropped: it loads Hub models) and the page's
``testsetup`` of the block's group, and after the page's earlier blocks of that group (each in
``try``: an earlier failure is not counted twice), then ``testcleanup``. ``doctest`` blocks
run their ``>>>`` lines; expected output (``testoutput``, doctest output) is not compared.
A ``testcode`` block's ``:skipif:`` is ignored (it runs, and fails for what is missing);
a ``testsetup``/``testcleanup`` block's is honoured (it runs under ``if not (skipif):``), as a
page's setup for its Comet block must not run before the others. The page's
``testcleanup`` runs after the group's last block only (Sphinx's order); before, in ``try``.

No GPU or MPS device is assumed: :data:`DOCS_EDITS` and :data:`EXAMPLE_EDITS` hold device
edits (``device='gpu'``/``'mps'`` -> ``'cpu'``), and the counts say how many passes needed one
(:data:`DEVICE_EDITED`). ``pytorch-lightning``, ``apache-libcloud`` and ``fasteners`` (the
fixtures' libcloud ``local`` store) are installed into the virtualenv without dependencies.

A table (name, ``pass``/``FAIL``/``timeout``, the last line of the error) and the counts are
printed; :data:`CAUSES` names the cause of each failure known not to be cadence's.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.composer_suite import DEFAULT_WORK, TAG, extract, make_venv, rename  # noqa: E402

#: The 14 examples, by file name under ``examples/``.
EXAMPLES = [
    "auto_microbatching.ipynb", "checkpoint_autoresume.ipynb", "custom_speedup_methods.ipynb",
    "early_stopping.ipynb", "exporting_for_inference.ipynb", "finetune_huggingface.ipynb",
    "functional_api.ipynb", "getting_started.ipynb", "migrate_from_ptl.ipynb",
    "pretrain_finetune_huggingface.ipynb", "checkpoint_with_wandb.py", "custom_models.py",
    "gyro_dropout_example.py", "profiler_demo.py",
]
#: Examples left out of the 14, each with why.
LEFT_OUT = {"TPU_Training_in_composer.ipynb": "needs a TPU (torch_xla)",
            "training_with_submitit.ipynb": "needs a SLURM cluster (submitit)"}

#: Substitutions applied to every example (pattern, replacement): shorter runs.
SHRINK: list[tuple[str, str]] = [
    (r"(['\"])([3-9]|\d\d+)ep\1", r"\g<1>2ep\1"),  # 'Nep' with N > 2 -> '2ep'
    (r"\bbatch_size\s*=\s*(\d{3,})", "batch_size=64"),  # 128 and above -> 64
    (r"\bnum_epochs = \d+", "num_epochs = 1"),
]
#: Further substitutions for one example (old, new): plain text.
EXAMPLE_EDITS: dict[str, list[tuple[str, str]]] = {
    "custom_speedup_methods.ipynb": [("resnet_56", "resnet_9")],  # as Composer's notebook test
    "gyro_dropout_example.py": [("max_duration='100ep'", "max_duration='2ep'"),
                                ("model = VGG13Model(num_hidden=64, num_classes=10).to('cuda')",
                                 "model = VGG13Model(num_hidden=64, num_classes=10)")],  # no GPU
    # the checkpoint the notebook loads is named for 2 batches an epoch (Composer's notebook
    # test cuts epochs to 2 batches); the stand-in MNIST's 256 samples make 64 of 4
    "exporting_for_inference.ipynb": [("ep2-ba4-rank0.pt", "ep2-ba128-rank0.pt")],
    "functional_api.ipynb": [("from tqdm.notebook import tqdm", "from tqdm import tqdm")],  # no Jupyter
    "profiler_demo.py": [("max_duration=2,", "max_duration=1,")],
    # device edits (no GPU): the notebook's assert dropped, device='gpu' -> 'cpu', its images
    # 96 -> 32 pixels (CPU time); 'auto' is kept: cadence takes it on CPU (the whole batch,
    # halved on out-of-memory), where Composer refuses it
    "auto_microbatching.ipynb": [
        ('assert torch.cuda.is_available(), "Demonstrating automatic gradient accumulation '
         'requires a GPU."', ""),
        ("device='gpu'", "device='cpu'"),
        ("transforms.Resize(size=[96, 96])", "transforms.Resize(size=[32, 32])")],
}
#: Examples and blocks that pass only with a device edit of :data:`EXAMPLE_EDITS` or
#: :data:`DOCS_EDITS` (no GPU or MPS here); the counts say so.
DEVICE_EDITED = {"auto_microbatching.ipynb", "trainer/using_the_trainer.rst:290",
                 "trainer/using_the_trainer.rst:327", "trainer/using_the_trainer.rst:411",
                 "trainer/using_the_trainer.rst:465", "trainer/using_the_trainer.rst:484"}
#: Further substitutions for one docs block (old, new), after the rename: device edits (no
#: GPU, no Apple MPS device: ``device='gpu'``/``'mps'`` -> ``'cpu'``).
DOCS_EDITS: dict[str, list[tuple[str, str]]] = {
    "trainer/using_the_trainer.rst:290": [("device='mps'", "device='cpu'")],
    **{f"trainer/using_the_trainer.rst:{line}": [("device='gpu'", "device='cpu'")]
       for line in (327, 411, 465, 484)},
}
#: Docs substitutions (pattern, replacement).
DOCS_SHRINK: list[tuple[str, str]] = [
    (r"(['\"])([3-9]|\d\d+)ep\1", r"\g<1>2ep\1"),
]

#: Edits to Composer's ``doctest_fixtures.py`` (old, new), after the rename: cadence has no
#: libcloud stores (``LibcloudObjectStore``, ``RemoteUploader``), so the local "object store"
#: the fixtures fake with libcloud's ``local`` provider is a ``file://`` folder instead.
#: cadence writes a remote ``save_folder`` with fsspec itself (no ``RemoteUploaderDownloader``
#: for the fixtures to patch), so an ``s3``/``oci``/``gs`` ``save_folder`` is made that local
#: folder too (its path kept, the bucket dropped, as the libcloud fake does).
FIXTURE_EDITS: list[tuple[str, str]] = [
    ("    if 'save_folder' in kwargs and urlparse(kwargs['save_folder']).scheme == 'gs':",
     "    if 'save_folder' in kwargs and urlparse(kwargs['save_folder']).scheme in ['s3', 'oci', 'gs']:\n"
     "        os.makedirs('./object_store', exist_ok=True)\n"
     "        kwargs['save_folder'] = 'file://' + os.path.abspath('./object_store') + '/' + "
     "urlparse(kwargs['save_folder']).path.lstrip('/')\n"
     "    if 'save_folder' in kwargs and urlparse(kwargs['save_folder']).scheme == 'gs':"),
    ("from cadence.utils import LibcloudObjectStore, RemoteUploader\n",
     "from cadence.utils import LibcloudObjectStore\n"),
    ("        kwargs['load_object_store'] = LibcloudObjectStore()",
     "        os.makedirs('./object_store', exist_ok=True)\n"
     "        from cadence.utils.file_helpers import FsspecObjectStore\n"
     "        kwargs['load_object_store'] = FsspecObjectStore("
     "'file://' + os.path.abspath('./object_store'))"),
    ("        bucket_uri='libcloud://.',\n        backend_kwargs={\n            'provider': 'local',\n"
     "            'container': '.',\n            'provider_kwargs': {\n"
     "                'key': os.path.abspath('./object_store'),\n            },\n        },\n",
     "        bucket_uri='file://' + os.path.abspath('./object_store'),\n"),
]

#: Known causes of failures that are not cadence's, by example or block name.
CAUSES: dict[str, str] = {
    'checkpoint_with_wandb.py':
        'environment: needs a W&B server (artifacts)',
    'getting_started/quick_start.rst:32':
        'stale on Composer: composer.models has no mnist_model in 0.32.1',
    'trainer/file_uploading.rst:171':
        'Neptune (left out of cadence)',
    'trainer/logging.rst:44':
        'Comet and Neptune (left out of cadence)',
    'trainer/using_the_trainer.rst:66':
        'stale on Composer: torch.optim.Adam(lr=0.01) without params',
    'trainer/using_the_trainer.rst:83':
        'follows using_the_trainer.rst:66 (its trainer)',
    'trainer/using_the_trainer.rst:379':
        'stale on Composer: Trainer(..., parallelism_config=...) syntax error',
    'trainer/using_the_trainer.rst:441':
        "stale on Composer: precision='amp' (Composer has amp_fp16/amp_bf16); device='gpu'",
    'trainer/using_the_trainer.rst:484':
        "a placeholder: load_path='path/to/checkpoint/mosaic_states.pt' exists nowhere "
        "(Composer fails alike)",
}

_DIRECTIVE = re.compile(r"^(\s*)\.\. (code-block|code|testcode|testsetup|testcleanup|doctest)::"
                        r"\s*(\S*)")
_FENCE = re.compile(r"^\s*```\s*(\S*)")


@dataclass
class Block:
    """One code block of a docs page: ``kind`` is the directive (``md`` for a fence),
    ``arg`` its argument (a language or doctest group), ``line`` 1-based."""
    page: str
    line: int
    kind: str
    arg: str
    code: str
    skipif: str = ""

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def group(self) -> str:
        return self.arg if self.kind.startswith(("test", "doctest")) and self.arg else "default"

    @property
    def runs(self) -> bool:
        """One of the 61: a ``testcode``/``doctest`` block, or Python ``code``/fence."""
        return self.kind in ("testcode", "doctest") or (
            self.kind in ("code", "code-block", "md") and self.arg in ("python", "py"))


def _dedent(lines: list[str]) -> str:
    import textwrap
    return textwrap.dedent("\n".join(lines)).strip("\n") + "\n"


def rst_blocks(text: str, page: str = "", offset: int = 0) -> list[Block]:
    """The code directives of reStructuredText ``text``: each block's body is the lines
    indented past its directive, less the directive's ``:option:`` lines."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        match = _DIRECTIVE.match(lines[i])
        if not match:
            i += 1
            continue
        indent = len(match.group(1))
        j, body = i + 1, []
        while j < len(lines) and (not lines[j].strip()
                                  or len(lines[j]) - len(lines[j].lstrip()) > indent):
            body.append(lines[j])
            j += 1
        skipif = ""
        while body and (not body[0].strip() or re.match(r"^\s*:[\w-]+:", body[0])):
            option = re.match(r"^\s*:skipif:\s*(.*)", body.pop(0))
            skipif = option.group(1).strip() if option else skipif
        blocks.append(Block(page, offset + i + 1, match.group(2), match.group(3), _dedent(body),
                            skipif))
        i = j
    return blocks


def md_blocks(text: str, page: str = "") -> list[Block]:
    """The fenced blocks of Markdown ``text``; an ``{eval-rst}`` fence yields the rst
    directives inside it."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        body = lines[i + 1:j]
        if match.group(1) == "{eval-rst}":
            blocks += rst_blocks("\n".join(body), page, offset=i + 1)
        else:
            blocks.append(Block(page, i + 1, "md", match.group(1), _dedent(body)))
        i = j + 1
    return blocks


def doctest_code(code: str) -> str:
    """The source of a ``doctest`` block: its ``>>>``/``...`` lines without their prompts."""
    out = []
    for line in code.splitlines():
        if line.startswith((">>> ", "... ")) or line in (">>>", "..."):
            out.append(line[4:])
    return "\n".join(out) + "\n"


def notebook_script(notebook: dict) -> str:
    """A notebook's code cells as one script, IPython's ``%``/``!`` lines dropped, each cell
    headed by a ``# cell N`` comment."""
    cells = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = cell["source"]
        source = "".join(source) if isinstance(source, list) else source
        kept = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        cells.append(f"# cell {index}\n" + "\n".join(kept))
    return "\n\n".join(cells) + "\n"


def shrink(text: str, substitutions: list[tuple[str, str]]) -> str:
    for pattern, new in substitutions:
        text = re.sub(pattern, new, text)
    return text


def page_blocks(path: Path, page: str) -> list[Block]:
    text = path.read_text(errors="replace")
    return md_blocks(text, page) if path.suffix == ".md" else rst_blocks(text, page)


def docs_scripts(docs: Path) -> dict[str, str]:
    """For each of the docs blocks that run, by name (``page:line``), its script."""
    fixtures = rename((docs / "doctest_fixtures.py").read_text())
    fixtures = fixtures[:fixtures.index("# Note: These methods are an alternative")]
    # Composer's patch of LibcloudObjectStore (its libcloud ``local`` provider, the
    # ./object_store folder) is kept; cadence has no RemoteUploader, whose patch is dropped
    libcloud_patch = fixtures[fixtures.index("# Patch ObjectStore __init__"):]
    fixtures = fixtures[:fixtures.index("# Patch RemoteUploader __init__")] + libcloud_patch
    for old, new in FIXTURE_EDITS:
        if old not in fixtures:
            raise ValueError(f"doctest_fixtures.py no longer holds {old!r}")
        fixtures = fixtures.replace(old, new)
    cleanup = rename((docs / "doctest_cleanup.py").read_text())
    scripts: dict[str, str] = {}
    for path in sorted(docs.rglob("*")):
        if path.suffix not in (".rst", ".md") or not path.is_file():
            continue
        page = str(path.relative_to(docs))
        blocks = page_blocks(path, page)
        if not any(b.kind in ("testcode", "doctest") for b in blocks):
            continue
        for target in (b for b in blocks if b.runs):
            parts = [fixtures]
            group = [b for b in blocks if b.runs and b.group == target.group]
            for block in blocks:
                if block.kind == "testsetup" and block.group in (target.group, "*"):
                    parts.append(_unless(block))
            parts += [_guarded(block) for block in group[:group.index(target)]]
            parts.append(_source(target))
            for block in blocks:
                if block.kind == "testcleanup" and block.group in (target.group, "*"):
                    # Sphinx cleans up once, after the group's last block
                    parts.append(_unless(block) if target is group[-1] else _guarded(block))
            parts.append(cleanup)
            scripts[target.name] = "\n".join(parts)
    return scripts


def _source(block: Block) -> str:
    code = doctest_code(block.code) if block.kind == "doctest" else block.code
    code = shrink(rename(code), DOCS_SHRINK)
    for old, new in DOCS_EDITS.get(block.name, []):
        if old not in code:
            raise ValueError(f"{block.name} no longer holds {old!r}")
        code = code.replace(old, new)
    return code


def _unless(block: Block) -> str:
    """A setup or cleanup block, under ``if not (skipif):`` when it has ``:skipif:``."""
    if not block.skipif:
        return rename(block.code)
    body = "".join(f"    {line}\n" for line in rename(block.code).splitlines())
    return f"if not ({block.skipif}):\n{body}    pass\n"


def _guarded(block: Block) -> str:
    return (f"try:\n    exec(compile({_source(block)!r}, {block.name!r}, 'exec'))\n"
            "except BaseException:\n    pass\n")


def example_scripts(examples: Path) -> dict[str, str]:
    """For each of :data:`EXAMPLES`, its script (renamed, shrunk, after the stand-ins)."""
    scripts = {}
    for name in EXAMPLES:
        path = examples / name
        text = notebook_script(json.loads(path.read_text())) if name.endswith(".ipynb") \
            else path.read_text()
        text = shrink(rename(text), SHRINK)
        for old, new in EXAMPLE_EDITS.get(name, []):
            text = text.replace(old, new)
        scripts[name] = "import composer_standins\ncomposer_standins.install()\n" + text
    return scripts


@dataclass
class Result:
    name: str
    outcome: str
    error: str = ""
    cause: str = field(default="")


def last_error(stderr: str) -> str:
    """The exception line of a traceback (the last line that is not blank or a warning)."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt|Warning)?\b.*:", line) \
                and not line.startswith(" "):
            if line.endswith(":") and index + 1 < len(lines):
                line += " " + lines[index + 1].strip()
            return line[:200]
    return lines[-1][:200] if lines else ""


def run_script(python: Path, name: str, script: str, src: Path, timeout: int) -> Result:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "PYTHONPATH")}
    env.update(PYTHONPATH=os.pathsep.join([str(src), str(REPO), str(REPO / "tools")]),
               HF_HUB_OFFLINE="1", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", MPLBACKEND="Agg", HF_DATASETS_OFFLINE="1")
    with tempfile.TemporaryDirectory() as cwd:
        (Path(cwd) / "script.py").write_text(script)
        try:
            proc = subprocess.run(["nice", "-n", "10", str(python), "script.py"], cwd=cwd,
                                  env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result(name, "timeout", f"over {timeout} s", CAUSES.get(name, ""))
    if proc.returncode == 0:
        return Result(name, "pass")
    return Result(name, "FAIL", last_error(proc.stderr), CAUSES.get(name, ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--composer-repo", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per script")
    parser.add_argument("--only", nargs="*", default=[], help="names (or prefixes) to run")
    parser.add_argument("--list", action="store_true", help="list the names and stop")
    parser.add_argument("--dump", type=Path, default=None, help="write the scripts here")
    args = parser.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    repo = args.composer_repo.resolve()
    archive = subprocess.run(["git", "-C", str(repo), "archive", TAG, "examples", "docs",
                              "composer/algorithms"],
                             check=True, capture_output=True).stdout
    sources = work / "examples_docs"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(sources, filter="fully_trusted")
    scripts = example_scripts(sources / "examples")
    docs = docs_scripts(sources / "docs" / "source")
    scripts.update(docs)
    if args.list:
        print("\n".join(scripts))
        print(f"{len(scripts) - len(docs)} examples, {len(docs)} docs blocks")
        return 0
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
        for name, script in scripts.items():
            (args.dump / (re.sub(r"[/:]", "_", name) + ".py")).write_text(script)
    python = make_venv(work)
    # the migrate_from_ptl notebook imports pytorch-lightning; the docs' fixtures fake an
    # object store with libcloud's local provider (which needs fasteners)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "pytorch-lightning",
                    "apache-libcloud", "fasteners"], check=True)
    src = work / "src" if (work / "src" / "tests").is_dir() else extract(repo, work)
    selected = {n: s for n, s in scripts.items()
                if not args.only or any(n.startswith(o) for o in args.only)}
    results = []
    for name, script in selected.items():
        result = run_script(python, name, script, src, args.timeout)
        results.append(result)
        print(f"| {name} | {result.outcome} | {result.error} | {result.cause} |", flush=True)
    examples = [r for r in results if r.name in EXAMPLES]
    blocks = [r for r in results if r.name not in EXAMPLES]
    for label, group in (("examples", examples), ("docs blocks", blocks)):
        passed = sum(r.outcome == "pass" for r in group)
        edited = sum(r.outcome == "pass" and r.name in DEVICE_EDITED for r in group)
        print(f"{label}: {passed} of {len(group)} pass ({edited} with a device edit)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
