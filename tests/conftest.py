"""Imports the engine before any test imports TensorFlow, and checks the
timeouts' scale before any test waits on it.

`engine/__init__.py` chooses TensorFlow's CPU kernels (oneDNN) and log level
through the environment, which TensorFlow reads once, early. Tests
that train in the pytest process then run the kernels users run, whichever
test file a worker happens to import first.
"""
import os
import shutil
import tempfile

import pytest

import engine  # pylint: disable=unused-import
from tests import timeouts


def pytest_configure(config):  # pylint: disable=unused-argument
  """A bad ENGINE_TEST_TIMEOUT_SCALE is one line before any test runs,
  rather than an error in every test that launches a process. And a cache
  of `auto` decisions of the tests' own (engine/compute/auto.py), for this
  process and those it launches: one the user's runs kept must not decide
  a test's, nor a test's the user's."""
  try:
    timeouts.scale()
  except ValueError as e:
    raise pytest.UsageError(str(e)) from None
  os.environ["HOROVOD_ENGINE_CACHE"] = tempfile.mkdtemp(prefix="engine-cache-")


def pytest_unconfigure(config):  # pylint: disable=unused-argument
  shutil.rmtree(os.environ.pop("HOROVOD_ENGINE_CACHE", ""), ignore_errors=True)


def pytest_report_header(config):  # pylint: disable=unused-argument
  return (f"timeouts: {timeouts.scale():.2f} times their nominal seconds on "
          f"this machine now (tests/timeouts.py; {timeouts.SCALE_VARIABLE} "
          "sets the factor)")


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups
def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """`make test`'s schedule (`pytest -n 3 --dist loadgroup`): a test file
  is one unit of work (its module fixtures, one trained run read by many
  tests, run once), and the tests marked serial are one unit together, run
  one after another on a worker of their own, beside the rest. They wait
  much of their time (on timeouts, signals, a scheduler, a database), which
  the other two workers fill; they never overlap each other, and each
  holds its own names for what it makes machine-wide (namespaces by its
  pid, mounts in its own directories)."""
  for item in items:
    serial = item.get_closest_marker("serial") is not None
    group = "serial" if serial else item.nodeid.split("::")[0]
    item.add_marker(pytest.mark.xdist_group(group))
