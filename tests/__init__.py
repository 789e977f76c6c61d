"""The test suite, in folders that mirror the package (issue 43); helpers in tests/support."""

import pytest

# the helpers' asserts explain a failure as a test's do (pytest rewrites only tests and conftest)
pytest.register_assert_rewrite("tests.support")
