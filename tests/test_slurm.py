"""The SLURM scripts, in a faked SLURM environment: the host list from
SLURM's variables, the batch script training for real on this node, and
its refusals (tests/test_slurm_cluster.py runs it under a real SLURM)."""
import json
import os
import shutil
import subprocess
import sys

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
  env = slurm("localhost", "2", SLURM_NTASKS="2", LAUNCHER="horovodrun",
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
  result = batch_script(env)
  assert result.returncode == 2
  assert "LAUNCHER=pdsh is unknown" in result.stderr


def batch_script(env):
  return subprocess.run([os.path.join(SCRIPTS, "train.sbatch")], env=env,
                        text=True, capture_output=True)


def test_a_gpu_job_runs_one_task_per_gpu_on_a_gpu_venv(slurm, tmp_path,
                                                      monkeypatch):
  # A submit directory of its own, with no .venv-gpu.
  submit_dir = tmp_path / "checkout"
  submit_dir.mkdir()
  (submit_dir / "scripts").symlink_to(os.path.join(fixtures.REPO, "scripts"))
  gpu_job = dict(SLURM_GPUS_PER_NODE="a100:2", SLURM_NTASKS="4",
                 SLURM_SUBMIT_DIR=str(submit_dir))
  # No VENV (make test exports its own): the GPU job's default.
  monkeypatch.delenv("VENV", raising=False)
  fewer_tasks = batch_script(slurm("node1 node2", "2,1", **gpu_job))
  assert (fewer_tasks.returncode, fewer_tasks.stderr) == (
      2, "train.sbatch: --gpus-per-node=2 but node2 runs 1 of the job's "
      "tasks: a GPU job runs one task per GPU; submit with "
      "--ntasks-per-node=2\n")
  no_venv = batch_script(slurm("node1 node2", "2(x2)", **gpu_job))
  assert (no_venv.returncode, no_venv.stderr) == (
      2, f"train.sbatch: no venv at {submit_dir}/.venv-gpu: set it up with "
      "make setup DEVICE=gpu (README), or pass VENV=\n")
  cpu_venv = os.path.dirname(os.path.dirname(sys.executable))
  on_cpu = batch_script(slurm("node1 node2", "2(x2)", VENV=cpu_venv,
                              **gpu_job))
  assert (on_cpu.returncode, on_cpu.stderr) == (
      2, f"train.sbatch: a GPU job on {cpu_venv}, which has TensorFlow's CPU "
      "build: set up the GPU venv with make setup DEVICE=gpu (README), or "
      "pass VENV=\n")
  # --gpus-per-task: SLURM starts each task on GPUs of its own.
  per_task = batch_script(slurm("node1", "2", SLURM_GPUS_PER_TASK="1",
                                SLURM_NTASKS="2",
                                SLURM_SUBMIT_DIR=str(submit_dir)))
  assert per_task.stderr.startswith(
      f"train.sbatch: no venv at {submit_dir}/.venv-gpu: "), per_task.stderr


@pytest.mark.parametrize("launcher", [None, "mpirun"])
def test_mpi_launchers_need_horovod_built_with_mpi(slurm, tmp_path, launcher):
  # A Horovod whose TensorFlow library links no MPI, ahead on the path.
  package = tmp_path / "site" / "horovod"
  (package / "tensorflow").mkdir(parents=True)
  (package / "__init__.py").write_text("")
  shutil.copy("/bin/true", package / "tensorflow" / "mpi_lib.so")
  env = slurm("localhost", "2", SLURM_NTASKS="2",
              SLURM_SUBMIT_DIR=fixtures.REPO, PYTHONPATH=str(tmp_path / "site"),
              **({"LAUNCHER": launcher} if launcher else {}))
  result = batch_script(env)
  venv = os.path.dirname(os.path.dirname(sys.executable))
  assert (result.returncode, result.stderr) == (
      2, f"train.sbatch: LAUNCHER={launcher or 'srun'} needs Horovod built "
      f"with MPI, and {venv}'s is not: install Open MPI and set up again "
      "(BUILD.md, \"MPI\"), or use LAUNCHER=horovodrun\n")


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
