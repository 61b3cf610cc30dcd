"""Multi-host training, for real: horovodrun over ssh between simulated hosts.

tests/simulated_hosts.py builds two hosts on this machine (network
namespaces with their own hostnames, addresses and sshd). Four jobs, run
from the first host through tests/workers/recorded_run.py on TFRecord
shards:

  2 hosts x 1 process, 1 epoch; the same command with --epochs=2, which
  resumes, its second epoch profiled; 2 hosts x 2 processes (local and
  cross ranks both > 1); 2 hosts x 1 process on links shaped to
  SHAPED_LINK (tc), one epoch of 16 steps at half the batch, profiled at
  the steps the resumed run was; and 2 hosts x 2 processes on links
  shaped to LEVELS_LINK, host1's ranks slowed in every step and rank 1 in
  every 2nd (tests/workers/slowed_model.py), profiled.

Skipped, with the reason, where hosts cannot be simulated (not root, no
network namespaces, no sshd).
"""
import glob
import json
import os
import re
import subprocess

import numpy as np
import pytest

from engine.records import scaling
from engine.records import step_report as step_report_lib
from tests import fixtures
from tests import simulated_hosts
from tests import timeouts

TRAIN_FILES = 4
# A link slow enough that the allreduce, not the tiny model, bounds the
# step. tbf lets a bucket of 64 KB (several steps' gradients) through at once,
# which refills while an epoch ends: the window is inside the one epoch,
# after 9 steps have drained it.
SHAPED_LINK, SHAPED_GBIT = "0.25mbit", 0.00025
PROFILED = "--profile_steps=10,16"
# The slowed job's delays, in its forward pass: host1's two ranks in every
# step, rank 1 (on host0) in every 2nd (late that often, it stands out of
# a busy machine's noise, which makes any rank late now and then).
HOST_DELAY_MS, RANK_DELAY_MS, RANK_EVERY = 40, 100, 2
# Its own data, an epoch of 40 steps at batch 1 on 4 ranks, and a window
# of 37 of them: rank 1 late in 19 (every 2nd), rank 0 in 0-2 on a quiet
# machine or one with both cores spun by other processes (2026-12-04, 3
# jobs each; 13 steps gave 6-8 and 0-1), so a rank twice as often late as
# rank 0 is named with a wide margin, which 13 steps did not leave.
SLOWED_TRAIN_FILES, SLOWED_WINDOW = 10, (3, 40)
# The slowed job's links between hosts: slow enough to tell from a host's
# own links, fast enough for the window's probe of 1 MiB (link_probe.py).
LEVELS_LINK, LEVELS_GBIT = "20mbit", 0.02
WORKER = os.path.join(fixtures.REPO, "tests", "workers", "recorded_run.py")

reason = simulated_hosts.unavailable()
# Serial: namespaces, bridges and mounts of its own (make test).
pytestmark = [pytest.mark.serial,
              pytest.mark.skipif(reason is not None, reason=str(reason))]


def run_job(hosts, tmp, name, *, per_host, epochs, model_dir, flags=(),
            model=("--model=cnn", "--filters=4"), env=None):
  out = tmp / name
  out.mkdir()
  command = [
      *fixtures.horovodrun(per_host * len(hosts.names)), "-H",
      ",".join(f"{n}:{per_host}" for n in hosts.names),
      "--ssh-port", str(hosts.ssh_port), "--ssh-identity-file",
      hosts.ssh_key, "--network-interface", hosts.interface,
      fixtures.PYTHON, WORKER, "--dataset=tfrecord",
      f"--data_dir={tmp / 'data'}", "--image_size=16", "--num_classes=10",
      *model, "--batch_size=4", f"--epochs={epochs}",
      f"--model_dir={model_dir}", "--progress=none", *flags]
  env = fixtures.engine_env(RECORD_OUT=str(out), **(env or {}))
  result = hosts.run(command, env=env)
  processes = fixtures.recorded_processes(out)
  return dict(result=result, output=result.stdout + result.stderr,
              processes=sorted(processes, key=lambda p: p["rank"]),
              model_dir=model_dir)


def machine_state():
  """What the simulated hosts must leave as they found it."""
  namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True,
                              text=True).stdout
  links = subprocess.run(["ip", "-br", "link"], capture_output=True,
                         text=True).stdout
  with open("/etc/hosts") as f:
    hosts = f.read()
  return dict(namespaces=namespaces, links=links, hosts=hosts,
              ssh_dir=os.path.exists(os.path.expanduser("~/.ssh")))


@pytest.fixture(scope="module")
def before():
  return machine_state()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, before):  # pylint: disable=redefined-outer-name
  del before  # taken first
  tmp = tmp_path_factory.mktemp("multihost")
  fixtures.write_tfrecords(str(tmp / "data"), num_files=TRAIN_FILES,
                           per_file=16, test_files=TRAIN_FILES)
  with simulated_hosts.SimulatedHosts(2) as hosts:
    return {
        "2x1": run_job(hosts, tmp, "2x1", per_host=1, epochs=1,
                       model_dir=tmp / "run_2x1"),
        "2x1 resumed": run_job(hosts, tmp, "2x1_resumed", per_host=1,
                               epochs=2, model_dir=tmp / "run_2x1",
                               flags=[PROFILED]),
        "2x2": run_job(hosts, tmp, "2x2", per_host=2, epochs=1,
                       model_dir=tmp / "run_2x2"),
        "2x2 slowed": slowed_job(hosts, tmp),
        "2x1 shaped": shaped_job(hosts, tmp),
    }


def slowed_job(hosts, tmp):
  hosts.shape(LEVELS_LINK)
  tmp = tmp / "slowed"
  fixtures.write_tfrecords(str(tmp / "data"), num_files=SLOWED_TRAIN_FILES,
                           per_file=16, test_files=TRAIN_FILES)
  return run_job(
      hosts, tmp, "2x2_slowed", per_host=2, epochs=1,
      model_dir=tmp / "run_2x2_slowed",
      model=["--model=" + os.path.join(
          fixtures.REPO, "tests", "workers", "slowed_model.py:conv_net")],
      flags=["--batch_size=1",
             "--profile_steps=%d,%d" % SLOWED_WINDOW,
             f"--profile_link_gbit={LEVELS_GBIT}"],
      env=dict(SLOWED_HOST="host1", SLOWED_HOST_MS=str(HOST_DELAY_MS),
               SLOWED_RANK="1", SLOWED_MS=str(RANK_DELAY_MS),
               SLOWED_EVERY=str(RANK_EVERY)))


def shaped_job(hosts, tmp):
  hosts.shape(SHAPED_LINK)
  return run_job(hosts, tmp, "2x1_shaped", per_host=1, epochs=1,
                 model_dir=tmp / "run_2x1_shaped",
                 flags=[PROFILED, "--batch_size=2",
                        f"--profile_link_gbit={SHAPED_GBIT}"])


@pytest.mark.parametrize("name", ["2x1", "2x1 resumed", "2x2",
                                  "2x2 slowed", "2x1 shaped"])
def test_training_finishes_on_every_rank_of_every_host(jobs, name):
  job = jobs[name]
  assert job["result"].returncode == 0, job["output"][-3000:]
  per_host = int(name[2])
  processes = job["processes"]
  assert [p["rank"] for p in processes] == list(range(2 * per_host))
  assert sorted(p["hostname"] for p in processes) == sorted(
      ["host0", "host1"] * per_host)
  assert {(p["local_size"], p["cross_size"]) for p in processes} == {
      (per_host, 2)}
  assert sorted((p["cross_rank"], p["local_rank"]) for p in processes) == [
      (c, l) for c in range(2) for l in range(per_host)]


@pytest.mark.parametrize("name", ["2x1", "2x1 resumed", "2x2", "2x2 slowed",
                                  "2x1 shaped"])
def test_weights_are_identical_everywhere(jobs, name):
  first, *others = jobs[name]["processes"]
  for other in others:
    for a, b in zip(first["weights"], other["weights"]):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["2x1", "2x2"])
def test_the_tfrecord_shards_are_split_across_all_ranks_of_all_hosts(
    jobs, name):
  shards = [p["train_files"] for p in jobs[name]["processes"]]
  files = [f for shard in shards for f in shard]
  assert len(files) == len(set(files)) == TRAIN_FILES  # disjoint, complete
  assert {len(shard) for shard in shards} == {TRAIN_FILES // len(shards)}


@pytest.mark.parametrize("name", ["2x1", "2x1 resumed", "2x2"])
def test_only_rank_zero_writes_checkpoints(jobs, name):
  job = jobs[name]
  saved = {p["rank"]: p["saved"] for p in job["processes"]}
  assert saved[0] and all(s["rank"] == 0 for s in saved[0])
  assert not any(saved[rank] for rank in saved if rank)
  assert glob.glob(str(job["model_dir"] / "checkpoints" / "ckpt-*.index"))


def test_a_second_run_resumes_across_hosts(jobs):
  resumed = jobs["2x1 resumed"]
  assert "at epoch 2, step 0" in resumed["output"]
  with open(resumed["model_dir"] / "metrics.jsonl") as f:
    assert [json.loads(line)["epoch"] for line in f] == [1, 2]
  # It trained the one remaining epoch only.
  steps = [len(p["steps"]) for p in resumed["processes"]]
  assert steps == [len(p["steps"]) for p in jobs["2x1"]["processes"]]


def step_report(job):
  return json.loads((job["model_dir"] / "profile" / "step_report.json")
                    .read_text())


def test_a_slow_link_makes_the_step_communication_bound(jobs):
  """The same steps of the same model, on links as they are and shaped:
  each rank's own window gathered across hosts, and the allreduce's
  exposed time grown into the part that bounds the step."""
  unshaped, shaped = (step_report(jobs[name])
                      for name in ("2x1 resumed", "2x1 shaped"))
  assert unshaped["window"] == shaped["window"] == [11, 16]
  assert shaped["verdict"]["bound"] == "communication"
  assert shaped["verdict"]["suggestions"][0].startswith(
      "--gradient_compression=fp16")
  assert shaped["transfer"] > 5 * unshaped["transfer"]
  assert shaped["verdict"]["shares"]["communication"] > \
      unshaped["verdict"]["shares"]["communication"]
  assert "communication-bound: " in jobs["2x1 shaped"]["output"]


def test_by_hand_a_link_is_shaped_before_the_command_runs():
  """tests/simulated_hosts.py from the command line: --link shapes the
  hosts' egress before the command runs on the first; a rate it cannot
  read ends it before any host is built, naming the flag."""
  def by_hand(*args):
    return subprocess.run(
        [fixtures.PYTHON, os.path.join("tests", "simulated_hosts.py"),
         "--hosts=1", *args], cwd=fixtures.REPO, capture_output=True,
        text=True, env=dict(os.environ, PYTHONPATH=fixtures.REPO),
        timeout=timeouts.bound(120))

  shown = by_hand("--link=1mbit", "--", "tc", "qdisc", "show", "dev",
                  "{interface}")
  assert shown.returncode == 0, shown.stderr
  assert re.search(r"qdisc tbf \S+ root .*rate 1Mbit", shown.stdout)
  unshaped = by_hand("--", "tc", "qdisc", "show", "dev", "{interface}")
  assert unshaped.returncode == 0 and "tbf" not in unshaped.stdout
  bad = by_hand("--link=fast", "--", "true")
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines()[-1].endswith(
      "--link: 'fast' is neither `unshaped` nor a rate such as 1gbit or "
      "500mbit")


def test_the_hosts_leave_the_machine_as_they_found_it(jobs, before):
  del jobs  # all the jobs have run, and their hosts are gone
  with pytest.raises(RuntimeError, match="a failure inside"):
    with simulated_hosts.SimulatedHosts(2):
      raise RuntimeError("a failure inside")
  assert machine_state() == before


def test_a_slowed_node_and_a_rank_slowed_now_and_then_are_named(jobs):
  """host1's two ranks sleep 40 ms in every forward pass, rank 1 (on
  host0) 100 ms in every 2nd: the report names the node, with both its
  ranks and about the delay, and measures rank 1 late in about half the
  steps, by the delay, and names it with its host and how often; no
  clock is compared across hosts (each rank's lateness is read from the
  waits on its own clock)."""
  report = step_report(jobs["2x2 slowed"])
  assert report["window"] == [4, 40]
  assert [(h["host"], h["ranks"]) for h in report["hosts"]] == [
      ("host0", [0, 1]), ("host1", [2, 3])]
  assert [(r["host"], r["local_rank"]) for r in report["ranks"]] == [
      ("host0", 0), ("host0", 1), ("host1", 0), ("host1", 1)]
  host1 = report["hosts"][1]["late"]
  # Late in (nearly) every step, by the delay within -25% and +50%.
  assert len(host1["steps"]) >= 0.8 * host1["of"] == 0.8 * 37
  late_by = np.median([seconds for seconds in host1["seconds"]])
  assert 0.75 * HOST_DELAY_MS < 1e3 * late_by < 1.5 * HOST_DELAY_MS, host1
  # In the phase the delay is in: host1's forward passes, by the delay.
  # Medians, as for rank 1 below: the suite's other workers stretch single
  # passes, and a mean over the window took one such (61 ms over for the
  # 40 ms delay once).
  forward = [r["distribution"]["forward"]["p50"] for r in report["ranks"]]
  for slowed in (2, 3):
    assert (0.75 * HOST_DELAY_MS < 1e3 * (forward[slowed] - forward[0])
            < 1.5 * HOST_DELAY_MS), forward
  rank1 = report["ranks"][1]["late"]
  # 100 ms late in every 2nd step: the 19 even global steps of 4-40, by
  # the delay. The suite's other workers share the cores, and stretch or
  # shrink single steps (4 of them above 75 ms once, one at 159 ms another
  # time): the steps counted are those late by half the delay, and their
  # median is held to it.
  delayed = [s for s in rank1["seconds"] if s > 0.5 * RANK_DELAY_MS / 1e3]
  assert 18 <= len(delayed) <= 20, rank1
  assert (0.75 * RANK_DELAY_MS < 1e3 * np.median(delayed)
          < 1.5 * RANK_DELAY_MS), rank1
  # The node first, then rank 1, late twice as often as rank 0 (the rule
  # on exact figures: test_step_report's
  # test_a_slow_node_and_a_rank_slow_half_the_time_are_both_named).
  node, rank = report["verdict"]["stragglers"]
  assert node.startswith("node host1 computes longer than the others")
  assert "its ranks 2, 3 reached the allreduce last together in " in node
  assert rank.startswith("rank 1 computes longer than the others")
  assert "; on host0 (local rank 1), it reached the allreduce last in " in (
      rank)
  output = jobs["2x2 slowed"]["output"]
  assert "a straggler: node host1 " in output
  assert "a straggler: rank 1 " in output


def test_each_level_of_the_links_is_probed_at_its_own_rate(jobs):
  """2 hosts x 2 processes on links shaped to 20 Mbit/s: the probe across
  hosts gives the rate within 30% (tc's bucket and TCP's headers); inside
  a host, where nothing is shaped, the links carry many times more; the
  2 processes on one host alone, where one ring over all 4 could only show
  the slower level."""
  levels = {level["level"]: level
            for level in step_report(jobs["2x2 slowed"])["link"]["levels"]}
  assert sorted(levels) == ["across hosts", "inside a host"]
  across, inside = levels["across hosts"], levels["inside a host"]
  assert across["processes"] == 2 and across["hosts"] == 2
  assert inside["processes"] == 2 and inside["hosts"] == 2
  assert across["bytes"] == inside["bytes"] == 1 << 20
  assert 0.7 < across["bus_gbit"] / LEVELS_GBIT < 1.3, across
  assert inside["bus_gbit"] > 5 * across["bus_gbit"], levels
  # The step's own allreduce, a kilobyte, is too small to fill the link:
  # the probe tells that from a slow network.
  assert re.search(r"the network does what the link allows \(probed across "
                   r"hosts, \d+%\), but the step's allreduce moves too few "
                   r"bytes at a time to fill it", jobs["2x2 slowed"]["output"])
  assert re.search(r"link levels: probed with 1\.05 MB allreduces: inside a "
                   r"host \S+ [GM]bit/s \(host\d's 2 processes, the slowest of 2 "
                   r"hosts\), across hosts \S+ Mbit/s \(2 processes, one a "
                   r"host; \d+% of the link\)", jobs["2x2 slowed"]["output"])


def test_a_shaped_link_gives_its_rate_as_the_allreduces_bandwidth(jobs):
  """Links shaped to 0.25 Mbit/s: the allreduce's bus bandwidth is the
  rate within 30% (tc's bucket and TCP's headers), and the verdict says
  the network does what the link allows; set against a link ten times
  faster, the same window says the network is slower than it should
  be."""
  report = step_report(jobs["2x1 shaped"])
  link = report["link"]
  assert link["crosses"] == "hosts" and link["link_gbit"] == SHAPED_GBIT
  assert link["levels"] == []  # a process a host: one level, not probed
  assert 0.7 < link["bus_gbit"]["p50"] / SHAPED_GBIT < 1.3, link
  assert report["verdict"]["network"].endswith(
      "the network does what the link allows")
  claimed = step_report_lib.across(
      report["ranks"], report["window"], fixtures.step_settings(
          gradient_bytes=link["gradient_bytes"],
          link=scaling.Link.of(10 * SHAPED_GBIT, 0)))
  assert claimed["verdict"]["network"].endswith(
      "the network is slower than it should be (other traffic, its "
      "interfaces' settings, the route)")
  assert "network: the allreduce's bus bandwidth " in (
      jobs["2x1 shaped"]["output"])
