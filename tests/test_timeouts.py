"""tests/timeouts.py: a slow or busy machine stretches the tests' bounds,
nothing shrinks them, and ENGINE_TEST_TIMEOUT_SCALE replaces the
measurement."""
import os

import pytest

from tests import timeouts


@pytest.fixture
def machine(monkeypatch):
  """Sets what the scale is measured from: the calibration's CPU seconds,
  the load average and the number of cores."""
  monkeypatch.delenv(timeouts.SCALE_VARIABLE, raising=False)

  def set_(*, calibration=timeouts.REFERENCE_SECONDS, load=0.0, cores=2):
    monkeypatch.setattr(timeouts, "calibration_seconds", lambda: calibration)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
  return set_


def test_the_reference_machine_quiet_waits_the_nominal_seconds(machine):
  machine()
  assert timeouts.bound(300) == 300


def test_a_faster_or_idle_machine_never_waits_less(machine):
  machine(calibration=timeouts.REFERENCE_SECONDS / 3, load=0.5, cores=64)
  assert timeouts.bound(300) == 300


def test_a_slower_cpu_stretches_the_bound_by_its_slowness(machine):
  machine(calibration=2.5 * timeouts.REFERENCE_SECONDS)
  assert timeouts.bound(300) == pytest.approx(750)


def test_a_busy_machine_stretches_it_by_processes_per_core(machine):
  machine(load=6.0, cores=2)
  assert timeouts.bound(300) == pytest.approx(900)
  machine(load=2.0, cores=2)  # every core busy, nobody waiting
  assert timeouts.bound(300) == 300


def test_slowness_and_busyness_multiply(machine):
  machine(calibration=2 * timeouts.REFERENCE_SECONDS, load=4.0, cores=2)
  assert timeouts.bound(300) == pytest.approx(1200)


def test_the_busier_of_the_last_minute_and_the_last_five_counts(
    machine, monkeypatch):
  machine()
  monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 6.0, 9.0))
  assert timeouts.bound(100) == pytest.approx(300)
  monkeypatch.setattr(os, "getloadavg", lambda: (6.0, 1.0, 9.0))
  assert timeouts.bound(100) == pytest.approx(300)


def test_the_variable_replaces_the_measurement(machine, monkeypatch):
  machine(calibration=3 * timeouts.REFERENCE_SECONDS, load=8.0, cores=2)
  monkeypatch.setenv(timeouts.SCALE_VARIABLE, "1.5")
  assert timeouts.bound(300) == pytest.approx(450)


@pytest.mark.parametrize("value", ["abc", "", "0", "0.5", "-2", "nan", "inf"])
def test_a_bad_variable_is_one_clear_error(machine, monkeypatch, value):
  machine()
  monkeypatch.setenv(timeouts.SCALE_VARIABLE, value)
  with pytest.raises(ValueError) as raised:
    timeouts.bound(300)
  assert str(raised.value) == (
      f"ENGINE_TEST_TIMEOUT_SCALE={value!r}: expected a number of at least "
      "1, the factor by which tests' timeouts are stretched on a slow "
      "machine; unset it to have the machine measured")


def test_the_calibration_is_measured_once_a_process():
  first = timeouts.calibration_seconds()
  assert 0 < first < 60
  assert timeouts.calibration_seconds() is first
