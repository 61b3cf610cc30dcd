"""engine.sweep on two hosts sharing one study in a real PostgreSQL.

tests/simulated_hosts.py builds two hosts; tests/simulated_postgres.py
runs Debian's PostgreSQL server on the first. One sweep worker runs on each
host, each with its own study directory, both with the same
--storage=postgresql://... and --study_name, asking the study for trials
until it holds --trials in all; each trial is a 1-process horovodrun on
its worker's host, whose rank 0 reports its epochs to the same database
over the hosts' network. Then `--best` on the other host, and an
unreachable database, refused in one line before anything is written.

Also: sweeps opening a new database at once, which race to create
Optuna's tables, all open it.

The two-host tests are skipped, with the reason, where not root or where
PostgreSQL's server is missing (scripts/setup.sh installs it as root).
"""
import concurrent.futures
import os
import subprocess

import pytest

from engine.sweeps import study as studies
from engine.sweeps import trials as sweep_trials
from tests import fixtures
from tests import simulated_hosts
from tests import simulated_postgres
from tests import timeouts

TRIALS = 4
WORKERS = 2  # one a host
STUDY = "fmnist"
# A trial of a few seconds: the cnn at width 4, 2 epochs of 256 images.
BASE_FLAGS = ["--mixed_precision=none", "--model=cnn", "--filters=4",
              "--batch_size=32", "--epochs=2", "--progress=none"]

reason = simulated_postgres.unavailable()
needs_hosts = pytest.mark.skipif(reason is not None, reason=str(reason))


def sweep_command(tmp, study_dir, storage) -> list[str]:
  return [fixtures.PYTHON, "-m", "engine.sweep", f"--study_dir={study_dir}",
          f"--space={tmp / 'space.yaml'}", f"--storage={storage}",
          f"--study_name={STUDY}", f"--trials={TRIALS}", "--processes=1",
          "--", f"--data_dir={tmp / 'data'}", *BASE_FLAGS]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("sweep_postgres")
  fixtures.write_fashion_mnist(str(tmp / "data"), num_train=256, num_test=64)
  (tmp / "space.yaml").write_text("base_lr: {log_uniform: [0.01, 0.3]}\n")
  return tmp


@pytest.fixture(scope="module")
def cluster():
  with simulated_hosts.SimulatedHosts(WORKERS) as hosts, \
      simulated_postgres.SimulatedPostgres(hosts) as db:
    yield hosts, db


@pytest.fixture(scope="module")
def swept(tmp, cluster):  # pylint: disable=redefined-outer-name
  """Both workers, at once, to their end; the study's trials then."""
  hosts, db = cluster

  def worker(i):
    return hosts.run(sweep_command(tmp, tmp / f"host{i}" / "study", db.url),
                     host=i, env=fixtures.engine_env(), timeout=300)

  with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
    for result in pool.map(worker, range(WORKERS)):
      assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  study = studies.open_study(studies.read_sweep(str(tmp / "host0" / "study")),
                             studies.storage(db.local_url()))
  return study.get_trials(deepcopy=False)


# Serial: namespaces, mounts and a server of their own (make test).
@pytest.mark.serial
@needs_hosts
def test_the_study_holds_the_trials_asked_for(swept):
  # A worker counts the study's trials (Sweeper._budget_left), then asks
  # for one: two steps, so workers that both count TRIALS - 1 both ask.
  # Each worker but one may add one trial too many.
  assert TRIALS <= len(swept) <= TRIALS + WORKERS - 1
  assert sorted(t.number for t in swept) == list(range(len(swept)))


@pytest.mark.serial
@needs_hosts
def test_trials_ran_on_both_hosts_each_in_its_workers_directory(tmp, swept):
  hosts = set()
  for trial in swept:
    host = trial.user_attrs["host"]
    study_dir = tmp / host / "study"
    assert trial.user_attrs["worker"] == f"{host}:{study_dir}"
    recorded = sweep_trials.read(studies.trial_dir(str(study_dir),
                                                   trial.number))
    assert recorded["state"] == trial.state.name.lower(), recorded
    hosts.add(host)
  assert hosts == {"host0", "host1"}


@pytest.mark.serial
@needs_hosts
def test_every_trial_ended_having_reported_over_the_network(swept):
  for trial in swept:
    assert trial.state.name in ("COMPLETE", "PRUNED"), trial
    # Rank 0's report after epoch 1, from its host to the database.
    assert 1 in trial.intermediate_values, trial


@pytest.mark.serial
@needs_hosts
def test_best_from_the_other_host(tmp, cluster, swept):
  hosts, _ = cluster
  complete = [t for t in swept if t.state.name == "COMPLETE"]
  best = max(complete, key=lambda t: t.value)
  shown = hosts.run([fixtures.PYTHON, "-m", "engine.sweep",
                     f"--study_dir={tmp / 'host0' / 'study'}", "--best"],
                    host=1, env=fixtures.engine_env(), timeout=60)
  assert shown.returncode == 0, shown.stderr
  lines = shown.stdout.splitlines()
  assert lines[0].startswith(f"# Trial {best.number} of the sweep in ")
  assert f"--base_lr={best.params['base_lr']}" in lines
  assert "--model=cnn" in lines


@pytest.mark.serial
@needs_hosts
def test_sweeps_opening_a_new_database_at_once_all_open_it(cluster):
  # Each creates Optuna's tables if it finds none: the losers of that race
  # open the winner's.
  _, db = cluster
  db.create_database("opened_at_once")
  url = db.local_url("opened_at_once")
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    opened = list(pool.map(lambda _: studies.storage(url), range(4)))
  assert [where.get_all_studies() for where in opened] == [[]] * 4


def test_an_unreachable_database_is_one_line_and_writes_nothing(tmp):
  study_dir = tmp / "unreachable" / "study"
  result = subprocess.run(
      sweep_command(tmp, study_dir, "postgresql://u:secret@127.0.0.1:1/db"),
      cwd=fixtures.REPO, env=fixtures.engine_env(), capture_output=True,
      text=True, timeout=timeouts.bound(60))
  assert result.returncode == 2, result.stderr
  assert result.stdout == ""
  [line] = result.stderr.strip().splitlines()
  assert line.startswith("engine.sweep: error: --storage=postgresql://"
                         "u:***@127.0.0.1:1/db: cannot open the study's "
                         "database ("), line
  assert "secret" not in line
  assert not os.path.exists(tmp / "unreachable")
