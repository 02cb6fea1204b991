"""Finding installed packages' files without importing them (``cadence.utils.packages``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cadence.utils.packages import find_package_dir, package_dir, resolve_package_path


def _make_package(root: Path, name: str) -> Path:
    folder = root / name
    (folder / "data").mkdir(parents=True)
    (folder / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (folder / "data" / "file.txt").write_text("hello")
    return folder


def test_finds_a_package_without_importing_it(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _make_package(tmp_path, "cadence_fake_data_pkg")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_package_dir("cadence_fake_data_pkg") == folder
    assert package_dir("cadence_fake_data_pkg") == folder
    path = resolve_package_path("pkg://cadence_fake_data_pkg/data/file.txt")
    assert Path(path).read_text() == "hello"
    assert "cadence_fake_data_pkg" not in sys.modules  # its __init__ never ran


def test_missing_package_and_plain_paths() -> None:
    assert find_package_dir("no_such_package_xyz") is None
    assert find_package_dir("") is None
    assert find_package_dir("json.decoder") is None  # a module, not a package
    with pytest.raises(ValueError, match="pip install --no-deps no-such-package-xyz"):
        package_dir("no_such_package_xyz")
    with pytest.raises(ValueError, match="pip install thing==1.0"):
        package_dir("no_such_package_xyz", install="pip install thing==1.0")
    with pytest.raises(ValueError, match="not installed"):
        resolve_package_path("pkg://no_such_package_xyz/model")
    assert resolve_package_path("/plain/path") == "/plain/path"
    assert resolve_package_path(Path("relative/dir")) == "relative/dir"
