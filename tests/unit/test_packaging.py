"""The wheel: the top-level ``console/`` directory ships as ``tracedpush.console`` (a
setuptools package-dir mapping, no symlink), every package of the tree is in it, and
`tracedpush console --help` runs from the wheel alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Not part of the source tree: environments, caches, build and run outputs (.gitignore).
NOT_SOURCE = {
    ".git",
    ".venv",
    ".models",
    ".pytest_cache",
    ".ruff_cache",
    "__pycache__",
    "build",
    "dist",
    "runs",
    "traces",
    "artifacts",
}


def _source_dirs(top: Path) -> list[Path]:
    """Every directory of the source tree under ``top``."""
    out = []
    for root, dirs, _ in os.walk(top):
        dirs[:] = [
            d
            for d in dirs
            if d not in NOT_SOURCE and not d.endswith(".egg-info") and not d.startswith(".venv")
        ]
        out.append(Path(root))
    return out


def _modules(package_dir: Path, installed_as: str) -> set[str]:
    """The wheel paths of a source package's modules."""
    return {
        f"{installed_as}/{p.relative_to(package_dir).as_posix()}"
        for d in _source_dirs(package_dir)
        for p in d.glob("*.py")
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """`pip wheel --no-deps` of a copy of the checkout (an in-tree build would leave
    build/ in the working tree, and stale files there can leak into a wheel)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=lambda _, names: [
            n for n in names if n in NOT_SOURCE or n.endswith((".egg-info", ".pyc"))
        ],
    )
    out = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(src), "-w", str(out)],
        check=True,
        timeout=600,
    )
    (path,) = out.glob("tracedpush-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def test_the_repository_has_no_symlinks():
    links = [
        p
        for d in _source_dirs(REPO)
        for p in d.iterdir()
        if p.is_symlink() and p.name not in NOT_SOURCE
    ]
    assert not links, f"symlinks in the source tree: {links}"


def test_the_wheel_ships_the_console_as_tracedpush_console(wheel: zipfile.ZipFile):
    names = set(wheel.namelist())
    console = _modules(REPO / "console", "tracedpush/console")
    assert {
        "tracedpush/console/__init__.py",
        "tracedpush/console/app.py",
        "tracedpush/console/command.py",
        "tracedpush/console/views/__init__.py",
        "tracedpush/console/views/overview.py",
        "tracedpush/console/views/requests.py",
        "tracedpush/console/views/timeline.py",
        "tracedpush/console/views/phases.py",
        "tracedpush/console/views/live.py",
        "tracedpush/console/views/export.py",
        "tracedpush/console/views/sweep.py",
    } <= console
    assert console <= names, sorted(console - names)
    assert not [n for n in names if n.startswith("console/")]  # no top-level `console`


def test_the_wheel_has_every_package_of_the_tree(wheel: zipfile.ZipFile):
    """pyproject.toml lists the packages (discovery cannot map console/): a new
    subpackage missing from that list would be silently left out of the wheel."""
    missing = _modules(REPO / "tracedpush", "tracedpush") - set(wheel.namelist())
    assert not missing, f"add their packages to [tool.setuptools] packages: {sorted(missing)}"


def test_tracedpush_console_help_runs_from_the_wheel(wheel: zipfile.ZipFile, tmp_path: Path):
    """From the wheel's files alone (no site-packages, so not the editable checkout)."""
    wheel.extractall(tmp_path)
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import tracedpush.console.command as c\n"
        f"assert c.__file__.startswith({str(tmp_path)!r}), c.__file__\n"
        "assert c.app_path().is_file(), c.app_path()\n"
        "from tracedpush.cli import main\n"
        "main(['console', '--help'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "--traces" in out.stdout and "--jaeger" in out.stdout
