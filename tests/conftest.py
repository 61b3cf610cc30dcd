"""Imports the engine before any test imports TensorFlow, and checks the
timeouts' scale before any test waits on it.

`engine/__init__.py` chooses TensorFlow's CPU kernels (oneDNN) and log level
through the environment, which TensorFlow reads once, early. Tests
that train in the pytest process then run the kernels users run, whichever
test file a worker happens to import first.
"""
import pytest

import engine  # pylint: disable=unused-import
from tests import timeouts


def pytest_configure(config):  # pylint: disable=unused-argument
  """A bad ENGINE_TEST_TIMEOUT_SCALE is one line before any test runs,
  rather than an error in every test that launches a process."""
  try:
    timeouts.scale()
  except ValueError as e:
    raise pytest.UsageError(str(e)) from None


def pytest_report_header(config):  # pylint: disable=unused-argument
  return (f"timeouts: {timeouts.scale():.2f} times their nominal seconds on "
          f"this machine now (tests/timeouts.py; {timeouts.SCALE_VARIABLE} "
          "sets the factor)")
