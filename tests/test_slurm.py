"""The SLURM scripts, in a faked SLURM environment: the host list from
SLURM's variables, and the batch script training for real on this node."""
import json
import os
import subprocess

import pytest

from tests import fixtures
from tests import timeouts

SCRIPTS = os.path.join(fixtures.REPO, "scripts", "slurm")


@pytest.fixture
def slurm(tmp_path):
  """A SLURM job's environment, with an `scontrol` that expands the node
  list (given here as space-separated names) as the real one would."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  scontrol = bin_dir / "scontrol"
  scontrol.write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && '
                      'printf "%s\\n" $3\n')
  scontrol.chmod(0o755)

  def env(nodes, tasks_per_node, **extra):
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
                SLURM_JOB_NODELIST=nodes, SLURM_TASKS_PER_NODE=tasks_per_node,
                **extra)
  return env


def hosts(env, *args):
  return subprocess.run([os.path.join(SCRIPTS, "hosts.sh"), *args], env=env,
                        text=True, capture_output=True)


def test_host_list_from_slurms_nodes_and_tasks(slurm):
  env = slurm("node1 node2 node3", "4(x2),3")
  assert hosts(env).stdout == "node1:4,node2:4,node3:3\n"
  assert hosts(env, "--hostfile").stdout == (
      "node1 slots=4\nnode2 slots=4\nnode3 slots=3\n")


def test_host_list_errors_are_one_line(slurm):
  mismatch = hosts(slurm("node1 node2", "4"))
  assert mismatch.returncode == 2
  assert mismatch.stderr == ("hosts.sh: 2 nodes but 1 task counts "
                             "(SLURM_TASKS_PER_NODE=4)\n")
  outside = hosts({k: v for k, v in os.environ.items()
                   if not k.startswith("SLURM_")})
  assert outside.returncode != 0
  assert "not inside a SLURM job" in outside.stderr


def test_the_batch_script_trains_on_the_allocation(slurm, tmp_path):
  data_dir = fixtures.write_fashion_mnist(str(tmp_path / "data"))
  env = slurm("localhost", "2", SLURM_NTASKS="2",
              SLURM_SUBMIT_DIR=fixtures.REPO, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
      [os.path.join(SCRIPTS, "train.sbatch"), *fixtures.ENGINE_FLAGS,
       f"--data_dir={data_dir}",
       f"--model_dir={tmp_path / 'run'}", "--epochs=1", "--filters=4",
       "--batch_size=32", "--progress=none"],
      env=env, text=True, capture_output=True, timeout=timeouts.bound(300))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "2 processes on localhost:2 via horovodrun" in result.stderr
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    assert json.loads(f.readline())["world_size"] == 2


def test_an_unknown_launcher_is_refused(slurm):
  env = slurm("localhost", "1", SLURM_NTASKS="1",
              SLURM_SUBMIT_DIR=fixtures.REPO, LAUNCHER="pdsh")
  result = subprocess.run([os.path.join(SCRIPTS, "train.sbatch")], env=env,
                          text=True, capture_output=True)
  assert result.returncode == 2
  assert "LAUNCHER=pdsh is unknown" in result.stderr


def test_the_scaling_scripts_bad_options_are_one_line(tmp_path):
  def scaling(*args):
    return subprocess.run([os.path.join(SCRIPTS, "scaling.sh"), *args],
                          text=True, capture_output=True)
  counts = scaling("--nodes=1,two", f"--out={tmp_path}/out")
  assert (counts.returncode, counts.stderr) == (
      2, "scaling.sh: --nodes=1,two: give node counts separated by commas, "
      "e.g. 1,2,4\n")
  flag = scaling("--epochs=2")
  assert (flag.returncode, flag.stderr) == (
      2, "scaling.sh: --epochs=2 is not an option of this script; put the "
      "engine's flags after --\n")
  assert not os.path.exists(tmp_path / "out")
