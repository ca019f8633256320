"""The contract kit as a plugin author meets it: a failing check shows the values it compared."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_failing_contract_check_shows_its_values(tmp_path) -> None:
    (tmp_path / "test_wrong_executor.py").write_text(
        textwrap.dedent(
            """
            import pytest

            from hetero_core.builtin import MockExecutor
            from hetero_core.testing import ExecutorContract


            class Shrunk(MockExecutor):
                def kv_cache_block_bytes(self, block_size):
                    return 100 - block_size  # more tokens, fewer bytes: wrong


            class TestShrunk(ExecutorContract):
                @pytest.fixture(scope="class")
                @classmethod
                def executor(cls):
                    return Shrunk()
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "block_bytes", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout
    assert "assert 92 >= 96" in result.stdout  # rewritten: the values, not a bare AssertionError
