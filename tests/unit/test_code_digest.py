"""`code_digest`: which analysis code made an index. A docstring, comment or layout edit
keeps the digest (every index stays); a change to what the code does changes it (every
index is built again). Kept per exact source bytes in the user's cache, so only the
first process after an upgrade parses the modules."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tracedpush.analysis import code_digest
from tracedpush.analysis import index as index_mod

SOURCE = '''"""A module."""

LIMIT = 3  # a comment


def f(x: int) -> int:
    """Doubles."""
    return x * LIMIT


class C:
    """A class."""

    def g(self) -> None:
        """Only a docstring."""
'''

SAME = [  # what a reader sees changes, what the code does not
    ('"""A module."""', '"""A module, reworded\n\nat length."""'),
    ("  # a comment", "  # another comment"),
    ('    """Doubles."""\n', ""),
    ("\n\nclass C:", "\n\n\n\nclass C:"),
    ("return x * LIMIT", "return (\n        x * LIMIT\n    )"),
    ('"""Only a docstring."""', "'''Only a docstring, in other quotes.'''"),
]
OTHER = [  # what the code does
    ("LIMIT = 3", "LIMIT = 4"),
    ("return x * LIMIT", "return LIMIT * x"),
    ("def f(x: int)", "def f(y: int)"),
    ('        """Only a docstring."""', '        """Only a docstring."""\n        return None'),
    ('"""A module."""', '"""A module."""\nimport os'),
]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tracedpush" / "code-digests"


def _digest(tmp_path: Path, source: str, salt: str = "3.11") -> str:
    d = tmp_path / f"src-{abs(hash(source))}"
    d.mkdir(exist_ok=True)
    (d / "mod.py").write_text(source)
    return code_digest.digest([d / "mod.py", d / "absent.py"], salt)


@pytest.mark.parametrize(("old", "new"), SAME)
def test_a_docstring_comment_or_layout_edit_keeps_the_digest(
    tmp_path: Path, old: str, new: str
) -> None:
    assert old in SOURCE
    assert _digest(tmp_path, SOURCE.replace(old, new, 1)) == _digest(tmp_path, SOURCE)


@pytest.mark.parametrize(("old", "new"), OTHER)
def test_a_change_to_what_the_code_does_changes_it(tmp_path: Path, old: str, new: str) -> None:
    assert old in SOURCE
    assert _digest(tmp_path, SOURCE.replace(old, new, 1)) != _digest(tmp_path, SOURCE)


def test_the_salt_changes_it(tmp_path: Path) -> None:
    assert _digest(tmp_path, SOURCE, "3.11 4") != _digest(tmp_path, SOURCE, "3.12 4")


def test_kept_per_source_bytes_so_only_the_first_process_parses(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _digest(tmp_path, SOURCE)
    (entry,) = cache.iterdir()
    assert entry.read_text().strip() == first

    def no_parse(*_a: object, **_k: object) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr(ast, "parse", no_parse)
    assert _digest(tmp_path, SOURCE) == first  # from the cache
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache.parent.parent))
    edited = SOURCE.replace("# a comment", "# edited")
    assert _digest(tmp_path, edited) == first  # other bytes: parsed, same digest
    assert len(list(cache.iterdir())) == 2


def test_a_bad_or_unwritable_cache_costs_a_parse_never_a_wrong_answer(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    right = _digest(tmp_path, SOURCE)
    (entry,) = cache.iterdir()
    entry.write_text("not a digest\n")
    assert _digest(tmp_path, SOURCE) == right
    assert entry.read_text().strip() == right  # mended
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # no directory can be made there
    assert _digest(tmp_path, SOURCE) == right


def test_the_cache_keeps_its_newest_entries(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(code_digest, "KEEP", 3)
    made: list[str] = []
    for i in range(5):
        before = {f.name for f in cache.iterdir()} if cache.exists() else set()
        _digest(tmp_path, SOURCE.replace("LIMIT = 3", f"LIMIT = {i}"))
        (new,) = {f.name for f in cache.iterdir()} - before
        made.append(new)
        for f in cache.iterdir():  # mtimes a second apart, oldest first
            os.utime(f, ns=(f.stat().st_mtime_ns - 10**9,) * 2)
    assert {f.name for f in cache.iterdir()} == set(made[-3:])


def test_the_index_digest_is_of_the_result_modules() -> None:
    """`format_key` carries this digest of the modules whose code decides a kept result."""
    here = Path(index_mod.__file__).resolve().parent
    files = [*(here / f"{m}.py" for m in index_mod._RESULT_MODULES), here.parent / "semconv.py"]
    sources = [(f.name, f.read_bytes()) for f in sorted(files)]
    assert len(sources) == len(index_mod._RESULT_MODULES) + 1
    import marshal
    import sys

    salt = f"{sys.version_info[:2]} {marshal.version}"
    assert index_mod._code_digest() == code_digest.semantic(sources, salt)
    assert index_mod._code_digest() in index_mod.format_key()[1]


def test_every_class_an_index_keeps_is_from_a_result_module(tmp_path: Path) -> None:
    """An index keeps pickled objects (the steps, their summary and contention, the skew
    evidence, ...). One kept by other code must not be read back: the classes' modules
    must all be among the digested ones, or an edit to one (a field added) leaves old
    objects without it in every index (`contention` was missing, and its objects kept)."""
    import io
    import pickle
    import sqlite3
    from contextlib import closing

    from tracedpush.analysis import TraceStore, analyze
    from tracedpush.testing import synthetic

    gen = synthetic.generate(40, seed=3, modes=("push",))
    traces = tmp_path / "traces"
    gen.write(traces)
    idx = index_mod.AnalysisIndex([traces])
    run = idx.update()
    run.contention()  # the derived results are made and kept as a report reads them
    run.engine_steps.summary()
    idx.close()
    assert analyze(TraceStore.from_path(traces), spans=False).contention()

    used: set[str] = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            used.add(module)
            return super().find_class(module, name)

    blobs = [f.read_bytes() for f in idx.dir.glob("*.pickle")]
    with closing(sqlite3.connect(idx.dir / "index.sqlite")) as db:
        blobs += [v for (v,) in db.execute("SELECT v FROM meta") if isinstance(v, bytes)]
    for blob in blobs:
        try:
            Recorder(io.BytesIO(blob)).load()
        except pickle.UnpicklingError:
            continue  # not a pickle (a marshal blob: plain values only)
    ours = {m for m in used if m.startswith("tracedpush")}
    digested = {f"tracedpush.analysis.{m}" for m in index_mod._RESULT_MODULES}
    assert "tracedpush.analysis.contention" in ours  # the kept contention was read
    assert ours <= digested | {"tracedpush.semconv"}, sorted(ours - digested)
