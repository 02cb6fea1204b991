"""tools/composer_examples.py's extraction and rename, on a tiny inline notebook and rst page
(no Composer checkout, no network, nothing run)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.composer_examples import (  # noqa: E402
    DOCS_EDITS, _source, doctest_code, md_blocks, notebook_script, rst_blocks, shrink, SHRINK,
)
from tools.composer_suite import rename  # noqa: E402

PAGE = """Title
=====

.. testsetup::

    x = 1

.. testcode::
    :skipif: not _LIBCLOUD_INSTALLED

    from composer import Trainer
    trainer = Trainer(max_duration='10ep')

Text.

.. code:: python

    import composer.functional as cf

.. code:: bash

    pip install composer

.. doctest::

    >>> y = 2
    >>> print(y)
    2
"""


def test_rst_blocks_kinds_lines_bodies_and_skipif() -> None:
    blocks = rst_blocks(PAGE, "page.rst")
    assert [(b.kind, b.arg, b.line) for b in blocks] == [
        ("testsetup", "", 4), ("testcode", "", 8), ("code", "python", 16),
        ("code", "bash", 20), ("doctest", "", 24)]
    assert [b.runs for b in blocks] == [False, True, True, False, True]
    code = blocks[1]
    assert code.skipif == "not _LIBCLOUD_INSTALLED"
    assert code.code == "from composer import Trainer\ntrainer = Trainer(max_duration='10ep')\n"
    assert code.name == "page.rst:8" and code.group == "default"
    assert doctest_code(blocks[4].code) == "y = 2\nprint(y)\n"


def test_source_renames_and_shrinks_a_block() -> None:
    block = rst_blocks(PAGE, "page.rst")[1]
    assert _source(block) == "from cadence import Trainer\ntrainer = Trainer(max_duration='2ep')\n"


def test_device_edits_apply_to_their_block_only() -> None:
    assert DOCS_EDITS["trainer/using_the_trainer.rst:327"] == [("device='gpu'", "device='cpu'")]
    page = ".. code:: python\n\n    t = Trainer(device='gpu')\n"
    assert _source(rst_blocks(page, "other.rst")[0]) == "t = Trainer(device='gpu')\n"


def test_md_fences_and_eval_rst() -> None:
    text = ("# T\n\n```python\nimport composer\n```\n\n```{eval-rst}\n.. testcode::\n\n"
            "    z = 3\n```\n")
    blocks = md_blocks(text, "page.md")
    assert [(b.kind, b.arg, b.line, b.code) for b in blocks] == [
        ("md", "python", 3, "import composer\n"), ("testcode", "", 8, "z = 3\n")]


def test_notebook_script_keeps_code_cells_drops_ipython_lines() -> None:
    notebook = {"cells": [
        {"cell_type": "markdown", "source": ["# Title"]},
        {"cell_type": "code", "source": ["%pip install mosaicml\n", "import composer\n"]},
        {"cell_type": "code", "source": "!ls\nx = composer.Trainer(batch_size=256)"},
    ]}
    script = notebook_script(notebook)
    assert script == "# cell 1\nimport composer\n\n# cell 2\nx = composer.Trainer(batch_size=256)\n"
    assert shrink(rename(script), SHRINK) == (
        "# cell 1\nimport cadence\n\n# cell 2\nx = cadence.Trainer(batch_size=64)\n")
