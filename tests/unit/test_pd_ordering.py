"""tests/conftest.py: pd-marked tests run after the rest, push before pull, and imply e2e."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def test_push_tests_run_before_pull_tests_and_are_e2e(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        test_a="""
        import pytest
        @pytest.mark.pd("pull")
        def test_a_pull(): pass
        def test_a_plain(): pass
        @pytest.mark.pd("push")
        def test_a_push(): pass
        """,
        test_b="""
        import pytest
        @pytest.mark.parametrize(
            "mode", [pytest.param(m, marks=pytest.mark.pd(m)) for m in ("pull", "push")]
        )
        def test_b_both(mode): pass
        def test_b_plain(): pass
        """,
    )
    result = pytester.runpytest("-v", "-p", "no:cacheprovider")
    order = [
        line.split("::")[1].split(" ")[0]
        for line in result.outlines
        if "::" in line and "PASSED" in line
    ]
    assert order == [
        "test_a_plain",
        "test_b_plain",
        "test_a_push",
        "test_b_both[push]",
        "test_a_pull",
        "test_b_both[pull]",
    ]
    deselected = pytester.runpytest("-m", "not e2e", "-p", "no:cacheprovider")
    deselected.assert_outcomes(passed=2, deselected=4)


def test_bad_mode_is_a_usage_error(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        """
        import pytest
        @pytest.mark.pd("sideways")
        def test_x(): pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*needs 'push' or 'pull'*"])
