"""The step report's figures, verdict and suggestions, from made-up
windows: what engine/records/step_report.py decides from each rank's
parts (the parts themselves are measured in test_step.py and, on two
processes, test_multiprocess.py and test_multihost.py); and what the
profiler leaves out of them across an epoch's end."""
import dataclasses
import json
import os

import numpy as np
import pytest

from engine.loop import session
from engine.records import horovod_timeline
from engine.records import link_levels
from engine.records import scaling
from engine.records import step_report
from engine.records import step_table
from tests import fixtures

CPU = fixtures.step_settings(processes_per_host=2, records=True)


def settings(**changed):
  return fixtures.step_settings(**{**dict(processes_per_host=2,
                                          records=True), **changed})


def rank(input=0.001, forward=0.004, backward=0.008, communication=0.002,
         optimizer=0.001, launch_and_read=0.001, between_calls=0.001):
  """One rank's parts, seconds a step."""
  return step_report.of_rank([dict(
      input=input, forward=forward, backward=backward,
      communication=communication, optimizer=optimizer,
      launch_and_read=launch_and_read, between_calls=between_calls)])


def test_a_ranks_parts_are_their_means_and_sum_to_its_step():
  figures = step_report.of_rank([
      dict(input=0.001, forward=0.002, backward=0.004, launch_and_read=0.001,
           between_calls=None),
      dict(input=0.003, forward=0.002, backward=0.006, launch_and_read=0.001,
           between_calls=0.002)])
  parts = figures["parts"]
  assert parts["input"] == pytest.approx(0.002)
  assert parts["backward"] == pytest.approx(0.005)
  # Not measured after an epoch's end: the mean of the steps that were.
  assert parts["between_calls"] == pytest.approx(0.002)
  assert parts["communication"] == parts["optimizer"] == 0.0
  # The parts' means (between_calls' of the one step that had it): 2 + 2 +
  # 5 + 1 + 2 ms.
  assert figures["step"] == pytest.approx(0.012)
  assert figures["in_graph"] == pytest.approx(0.007 / 0.008)


@pytest.mark.parametrize("count", [5, 20, 100])
def test_percentiles_interpolate_between_the_samples_around_them(count):
  """A window of `count` steps, the last one slow: p50 and p95 are
  numpy's (interpolated between the two samples around each), and with
  few steps p95 is not the max (the nearest rank's was, up to 20 steps).
  Of 5 steps, 1 to 4 ms and 10 ms: p95 is 0.8 of the way from 4 to 10."""
  steps = [0.001 * (i % 4 + 1) for i in range(count - 1)] + [0.010]
  spread = step_report.of_rank([dict(forward=s) for s in steps])[
      "distribution"]["forward"]
  assert spread["p50"] == pytest.approx(np.percentile(steps, 50))
  assert spread["p95"] == pytest.approx(np.percentile(steps, 95))
  assert spread["max"] == 0.010
  assert spread["p95"] < spread["max"]
  if count == 5:
    assert spread["p95"] == pytest.approx(0.0088)
    assert spread["p50"] == pytest.approx(0.003)


def test_the_verdict_is_the_largest_part_of_the_slowest_ranks_step():
  report = step_report.across([rank(), rank(forward=0.002)], (4, 5), CPU)
  assert report["slowest_rank"] == 0
  found = report["verdict"]
  assert found["bound"] == "compute"
  assert found["shares"]["compute"] == pytest.approx(0.013 / 0.018)
  assert sum(found["shares"].values()) == pytest.approx(1.0)
  # What the engine offers against compute on a CPU, nothing else: the
  # other parts are small.
  assert found["suggestions"] == [
      "--mixed_precision=bfloat16 (where the CPU has AVX512_BF16 or AMX)"]


@pytest.mark.parametrize("slow, bound, first", [
    (dict(input=0.05), "input", "--cache_records"),
    (dict(communication=0.05), "communication",
     "--gradient_compression=fp16"),
    (dict(between_calls=0.05), "host", "--steps_per_call above 1"),
])
def test_each_bound_gets_what_the_engine_offers_against_it(slow, bound,
                                                           first):
  found = step_report.across([rank(**slow)] * 2, (1, 2), CPU)["verdict"]
  assert found["bound"] == bound
  assert found["suggestions"][0].startswith(first)


def test_what_the_run_already_does_is_not_suggested():
  slow = dict(communication=0.05)
  done = settings(gradient_compression="fp16", grad_accum_steps=4,
                  processes_per_host=1, allreduce_op="adasum")
  found = step_report.across([rank(**slow)] * 2, (1, 2), done)["verdict"]
  assert found["suggestions"] == [
      "Horovod's fusion and cycle (horovodrun --fusion-threshold-mb, "
      "--cycle-time-ms)"]
  found = step_report.across(
      [rank()] * 2, (1, 2), settings(mixed_precision="bfloat16")
  )["verdict"]
  assert found["bound"] == "compute" and found["suggestions"] == []
  # Data that is not TFRecords is neither cached nor staged.
  found = step_report.across([rank(input=0.05)] * 2, (1, 2),
                             settings(records=False))["verdict"]
  assert found["suggestions"] == [
      "more cores for each process's reads (tf.data reads in parallel, as "
      "many as it has cores)"]
  gpu = step_report.across([rank()] * 2, (1, 2), settings(device="GPU"))
  assert gpu["verdict"]["suggestions"] == ["--mixed_precision=float16",
                                           "--xla"]


def test_processes_sharing_a_host_on_gloo_are_offered_mpi():
  """Communication-bound, 2 processes a host: on Gloo, MPI is offered
  (faster between processes of one host, measured); on MPI, or with a
  process a host, it is not. The network's line names the controller."""
  slow = [rank(communication=0.05)] * 2
  def report(**changed):
    return step_report.across(slow, (1, 2), settings(
        gradient_bytes=1_000_000, **changed))
  gloo = report(controller="Gloo")
  assert any(text.startswith("Horovod's MPI for processes that share a "
                             "host") for text in gloo["verdict"][
                                 "suggestions"])
  assert "2 processes, across one host, on Horovod's Gloo)" in (
      gloo["verdict"]["network"])
  for changed in (dict(controller="MPI"),
                  dict(controller="Gloo", processes_per_host=1)):
    assert not any("Horovod's MPI" in text
                   for text in report(**changed)["verdict"]["suggestions"])


def test_a_cpu_decoding_its_records_each_epoch_is_offered_the_cache():
  """On a CPU, records of declared features streamed each epoch are
  decoded on the cores that compute: a compute-bound run is offered
  --cache_records after bfloat16; not once cached, nor on a GPU."""
  streamed = settings(streams_declared_records=True)
  found = step_report.across([rank()] * 2, (1, 2), streamed)["verdict"]
  assert found["bound"] == "compute"
  assert found["suggestions"][0].startswith("--mixed_precision=bfloat16")
  assert found["suggestions"][1].startswith(
      "--cache_records: the records are decoded on the cores that compute")
  # Offered against input too, it is offered once, where it comes first.
  found = step_report.across([rank(input=0.009)] * 2, (1, 2),
                             streamed)["verdict"]
  assert found["bound"] == "compute" and found["shares"]["input"] > 0.25
  assert [s.split(":")[0] for s in found["suggestions"]
          if s.startswith("--cache_records")] == ["--cache_records"]
  assert found["suggestions"][1].startswith(
      "--cache_records: the records are decoded on the cores that compute")
  for other in (dataclasses.replace(streamed, streams_declared_records=False),
                dataclasses.replace(streamed, device="GPU")):
    found = step_report.across([rank()] * 2, (1, 2), other)["verdict"]
    assert not any(s.startswith("--cache_records")
                   for s in found["suggestions"])


def test_the_session_tells_streamed_records_of_declared_features(tmp_path):
  """What the run gives the report: records of declared features
  (features.txt) streamed, not once cached, nor ImageNet's layout."""
  declared = tmp_path / "volumes"
  declared.mkdir()
  (declared / "features.txt").write_text(
      "x:raw_int16:4x4x4x1\ny:float32:4\n")
  imagenet = tmp_path / "imagenet"
  imagenet.mkdir()

  def read(directory, cache_records=False):
    config = fixtures.train_config(data=dict(
        name="tfrecord", dir=str(directory),
        params=dict(tfrecord_features="", cache_records=cache_records)))
    return session._records_read(config.data)  # pylint: disable=protected-access

  assert read(declared) == dict(records=True, cache_records=False,
                                image_records=False,
                                streams_declared_records=True)
  assert read(declared, cache_records=True)["streams_declared_records"] is False
  assert read(imagenet) == dict(records=True, cache_records=False,
                                image_records=True,
                                streams_declared_records=False)


def test_records_of_encoded_images_are_not_offered_the_cache():
  """--cache_records takes records of declared features only: an
  input-bound run on ImageNet's layout is offered staging first."""
  found = step_report.across([rank(input=0.05)] * 2, (1, 2),
                             settings(image_records=True))["verdict"]
  assert found["bound"] == "input"
  assert found["suggestions"][0].startswith("--stage_dir")
  assert not any(s.startswith("--cache_records")
                 for s in found["suggestions"])


def test_a_second_notable_part_gets_its_suggestions_after_the_bounds():
  found = step_report.across([rank(input=0.009)] * 2, (1, 2),
                             CPU)["verdict"]
  assert found["bound"] == "compute" and found["shares"]["input"] > 0.25
  assert found["suggestions"][0].startswith("--mixed_precision")
  assert found["suggestions"][1].startswith("--cache_records")


def test_a_rank_busy_longer_is_named_with_where_its_time_goes():
  # Rank 1 computes 10 ms longer; rank 0 waits for it in the allreduce.
  ranks = [rank(communication=0.012), rank(forward=0.014)]
  report = step_report.across(ranks, (4, 5), CPU)
  assert report["slowest_rank"] == 1
  assert report["slowest_by"] == pytest.approx(0.010)
  assert report["slowest_in"] == "compute"
  assert report["transfer"] == pytest.approx(0.002)
  assert [r["waiting"] for r in report["ranks"]] == pytest.approx(
      [0.010, 0.0])
  assert report["verdict"]["straggler"].startswith(
      "rank 1 computes longer than the others")
  # Waiting for its batches instead.
  report = step_report.across([rank(communication=0.012),
                               rank(input=0.011)], (4, 5), CPU)
  assert (report["slowest_rank"], report["slowest_in"]) == (1, "input")
  assert report["verdict"]["straggler"].startswith("rank 1 waits longer")


def test_ranks_alike_have_no_straggler():
  report = step_report.across([rank(), rank(forward=0.0041)], (4, 5), CPU)
  assert report["verdict"]["straggler"] is None


def test_the_table_shows_each_rank_the_verdict_and_what_to_try():
  report = step_report.across([rank(communication=0.012),
                               rank(forward=0.014)], (4, 5), CPU)
  lines = step_table.table(report).splitlines()
  assert lines[0].split() == ["rank", "step", *step_report.PARTS,
                              "waiting"]
  assert [line.split()[0] for line in lines[1:3]] == ["0", "1"]
  assert lines[1].split()[1] == "28.00"  # ms, rank 0's step
  assert lines[3].startswith("steps 4-5, ms a step; slowest rank 1, busy "
                             "10.00 ms a step longer than the least busy, "
                             "in its compute")
  assert lines[4].startswith("compute-bound: input 4%, compute 82%, communication 7%, ")
  assert lines[5].startswith("a straggler: rank 1 computes longer")
  assert lines[6] == ("  try --mixed_precision=bfloat16 (where the CPU has "
                      "AVX512_BF16 or AMX)")


def test_the_call_after_an_epochs_end_is_not_timed_from_the_last(tmp_path):
  """Between two calls across an epoch's end lie its evaluation and save,
  not the loop's time between calls: left out of the mean."""
  import json  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  from engine import distributed  # pylint: disable=import-outside-toplevel
  from engine.loop import actions  # pylint: disable=import-outside-toplevel
  from engine.loop import profiling  # pylint: disable=import-outside-toplevel
  from engine.compute import step as steps  # pylint: disable=import-outside-toplevel
  distributed.start_horovod()
  profiler = profiling.StepProfiler(str(tmp_path), steps=(1, 3), rank=0,
                                    all_ranks=False, timeline=False,
                                    settings=CPU)

  class TimedStep:
    timed_traces = 0

    def train(self, num_steps, stop_requested, timed):
      del stop_requested
      assert timed
      self.timed_traces = 1  # traced at its first call
      return steps.Trained(steps=num_steps, stop_agreed=False,
                           input_seconds=0.0, phases={"forward": 0.001})

  timed_step = TimedStep()

  for global_step, pause in ((1, 0.0), (2, 0.05), (3, 0.6)):
    if global_step == 3:
      profiler.start_epoch()
    time.sleep(pause)
    with profiler.step(global_step):
      profiler.timed(timed_step, 1, False)
    profiler.run(actions.At(global_step=global_step, epoch=0,
                            step=global_step, model=None, rank=0,
                            world_size=1, is_chief=True,
                            model_dir=str(tmp_path)))
  report = json.loads((tmp_path / "profile" / "step_report.json")
                      .read_text())
  assert report["window"] == [2, 3]
  between = report["ranks"][0]["parts"]["between_calls"]
  assert 0.04 < between < 0.2, between  # step 2's alone: with 3's, 0.3


def window(host, local_rank, communication, forward=None, profiled=False):
  """One rank's window of steps: `communication` and `forward` lists of
  seconds a step (forward 4 ms each if not given), the rest as `rank`
  has it; `profiled`, traced by TensorFlow's profiler."""
  forward = forward or [0.004] * len(communication)
  return step_report.of_rank(
      [dict(input=0.001, forward=f, backward=0.008, communication=c,
            optimizer=0.001, launch_and_read=0.001, between_calls=0.001)
       for c, f in zip(communication, forward)], host=host,
      local_rank=local_rank, profiled=profiled)


def test_a_node_whose_ranks_are_all_late_is_named_with_how_late():
  """Four ranks on two hosts; host1's two reach the allreduce 40 ms after
  host0's in every step: host0's wait it out. The node is named, not a
  rank, with its ranks and by how much; the spread is each rank's."""
  steps = 10
  early = [0.042 + 0.001 * (i % 3) for i in range(steps)]
  late, slowed = [0.002] * steps, [0.044 + 0.001 * (i % 3)
                                   for i in range(steps)]
  report = step_report.across(
      [window("host0", 0, early), window("host0", 1, early),
       window("host1", 0, late, slowed), window("host1", 1, late, slowed)],
      (11, 20), CPU)
  assert [(h["host"], h["ranks"]) for h in report["hosts"]] == [
      ("host0", [0, 1]), ("host1", [2, 3])]
  assert report["hosts"][1]["late"]["steps"] == list(range(steps))
  assert not report["hosts"][0]["late"]["steps"]
  [straggler] = report["verdict"]["stragglers"]
  assert straggler.startswith("node host1 ")
  assert straggler.endswith("its ranks 2, 3 reached the allreduce last "
                            "together in 10 of 10 steps, by 40-42 ms a step")
  spread = report["ranks"][0]["distribution"]["communication"]
  assert spread == pytest.approx(dict(p50=0.043, p95=0.044, max=0.044))
  assert report["ranks"][0]["series"]["communication"] == early
  text = step_table.table(report)
  assert "a straggler: node host1 " in text
  assert "rank 2 on host1 (local rank 0): step p50 " in text


def test_a_rank_late_in_some_steps_is_named_with_how_often():
  """Rank 1 reaches the allreduce 80-120 ms late in 3 steps of 20; on
  average it is busier by less than a tenth of its step, and it is named
  all the same, with its host."""
  waits, forward = [0.002] * 20, [0.004] * 20
  for i, late in ((3, 0.08), (9, 0.1), (15, 0.12)):
    waits[i], forward[i] = 0.002 + late, 0.004 + late
  own = [0.002] * 20
  report = step_report.across(
      [window("a", 0, waits), window("b", 0, own, forward)], (1, 20), CPU)
  late = report["ranks"][1]["late"]
  assert (late["steps"], late["of"]) == ([3, 9, 15], 20)
  assert late["by"] == pytest.approx([0.08, 0.12])
  assert late["seconds"][3] == pytest.approx(0.08)
  assert report["verdict"]["straggler"] == (
      "rank 1 computes longer than the others: a slower or busier host "
      "(what else runs on its cores; --bind_cpus); on b (local rank 0), it "
      "reached the allreduce last in 3 of 20 steps, by 80-120 ms a step")
  # Late once in 20, by 20 ms: noise, not a straggler (nor on average:
  # 1 ms a step, under a tenth of the step).
  waits[3], forward[3] = 0.022, 0.024
  waits[9] = waits[15] = 0.002
  forward[9] = forward[15] = 0.004
  report = step_report.across(
      [window("a", 0, waits), window("b", 0, own, forward)], (1, 20), CPU)
  assert report["verdict"]["stragglers"] == []


def test_the_rank_tensorflows_profiler_traced_alone_is_not_a_straggler():
  """Rank 0, traced by TensorFlow's profiler alone, computes 30 ms longer
  in 8 steps of 20: the profiler's doing, so no straggler is named, and
  the table says why; traced alike (--profile_all_ranks), the same rank
  is named."""
  waits, forward = [0.002] * 20, [0.004] * 20
  for i in range(0, 20, 5):
    waits[i] = waits[i + 1] = 0.032
    forward[i] = forward[i + 1] = 0.034
  def report(rank1_profiled):
    return step_report.across(
        [window("a", 0, [0.002] * 20, forward, profiled=True),
         window("a", 1, waits, profiled=rank1_profiled)], (1, 20), CPU)
  alone = report(rank1_profiled=False)
  assert alone["ranks"][0]["late"]["steps"] == [0, 1, 5, 6, 10, 11, 15, 16]
  assert alone["verdict"]["stragglers"] == []
  assert ("rank 0 ran TensorFlow's profiler, which slows it: not named a "
          "straggler") in step_table.table(alone)
  alike = report(rank1_profiled=True)
  assert alike["verdict"]["straggler"].startswith("rank 0 computes longer")
  assert "ran TensorFlow's profiler" not in step_table.table(alike)


def test_the_allreduces_bandwidth_is_set_against_the_link():
  """2 ranks, 1 MB of gradients through the allreduce in 8 ms (the
  smallest communication of the step): each rank sends and receives
  half the bytes twice, 1 Gbit/s on the bus. On a 10 Gbit/s link that is
  slower than it should be, on a 1.2 Gbit/s link it is not."""
  ranks = [window("a", 0, [0.008] * 4 + [0.016]),
           window("b", 0, [0.009] * 5)]
  def report(gbit):
    return step_report.across(ranks, (1, 5), dataclasses.replace(
        CPU, gradient_bytes=1_000_000,
        link=scaling.Link.of(gbit, 0) if gbit else None))
  link = report(None)["link"]
  assert link["crosses"] == "hosts" and link["processes"] == 2
  assert link["bus_gbit"]["p50"] == pytest.approx(1.0)
  assert link["bus_gbit"]["max"] == pytest.approx(1.0)
  assert link["bus_gbit"]["p95"] == pytest.approx(1.0)
  assert report(None)["verdict"]["network"].endswith(
      "give --profile_link_gbit to set it against the link")
  fast = report(10)
  assert fast["link"]["share"] == pytest.approx(0.1)
  assert fast["link"]["expected_seconds"] == pytest.approx(0.0008)
  assert "the network is slower than it should be" in (
      fast["verdict"]["network"]) or "a small part of the step" in (
          fast["verdict"]["network"])
  assert report(1.2)["verdict"]["network"].endswith(
      "the network does what the link allows")


def test_the_timeline_splits_communication_into_negotiation_and_collective():
  """Rank 0 waits 40 ms for rank 1 in every step; Horovod's Cycle and the
  negotiation cost rank 1 (the last to arrive) 1 ms; the allreduce itself
  runs 3 ms. The timeline's collective is each rank's communication less
  its negotiation, and the link's bandwidth is the collective's, not the
  least communication's (4 ms)."""
  ranks = [window("a", 0, [0.044] * 4), window("b", 0, [0.004] * 4)]
  settings_ = dataclasses.replace(CPU, gradient_bytes=1_000_000)
  report = step_report.across(ranks, (1, 4), settings_,
                              collective=[0.003] * 4)
  assert report["collective"]["seconds"] == pytest.approx(0.003)
  assert [r["negotiation"] for r in report["ranks"]] == pytest.approx(
      [0.041, 0.001])
  # 1 MB, each rank sending and receiving half twice, in 3 ms.
  assert report["link"]["bus_gbit"]["p50"] == pytest.approx(8 / 3)
  assert ("communication, from Horovod's timeline: the collective itself "
          "3.00 ms a step; negotiating and waiting for the others rank 0 "
          "41.00 ms, rank 1 1.00 ms") in step_table.table(report)
  # Without the timeline: the least communication is the transfer.
  estimated = step_report.across(ranks, (1, 4), settings_)
  assert "collective" not in estimated and "negotiation" not in (
      estimated["ranks"][0])
  assert estimated["link"]["bus_gbit"]["p50"] == pytest.approx(2.0)


def test_the_timeline_gives_each_calls_collective_time(tmp_path):
  """Horovod's timeline as rank 0 writes it: microseconds from its start,
  which its first record gives since the epoch. Two tensors fused into
  one allreduce count once; the negotiation before it is not the
  collective's; a collective running past a call's end counts within the
  call alone; a call of two steps is halved."""
  start = 1_000_000_000_000_000  # in microseconds since the epoch
  events = [
      {"name": "process_name", "ph": "M", "pid": 0,
       "args": {"start_time_since_epoch_in_micros": start}}]
  def tensor(pid, negotiated, began, ended, collective="ALLREDUCE"):
    events.extend([
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": negotiated,
         "pid": pid},
        {"ph": "E", "ts": began, "pid": pid},
        {"ph": "B", "name": collective, "ts": began, "pid": pid},
        {"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": began,
         "pid": pid},
        {"ph": "E", "ts": began + 100, "pid": pid},
        {"ph": "E", "ts": ended, "pid": pid}])
  tensor(1, 0, 40_000, 43_000)  # 40 ms negotiating, 3 ms reducing
  tensor(2, 0, 40_500, 43_000)  # fused with the first
  tensor(1, 100_000, 101_000, 106_000)  # 1 ms negotiating, 5 ms reducing
  tensor(3, 200_000, 210_000, 214_000, collective="ADASUM")
  path = tmp_path / "timeline.json"
  path.write_text(json.dumps(events))
  def call(began_ms, ended_ms, steps=1):
    return dict(span=((start + 1e3 * began_ms) * 1e-6,
                      (start + 1e3 * ended_ms) * 1e-6), steps=steps)
  seconds = horovod_timeline.collective_seconds(
      str(path), [call(0, 50), call(50, 104), call(150, 250, steps=2)])
  assert seconds == pytest.approx([0.003, 0.003, 0.002], abs=1e-6)


def test_the_links_levels_name_the_host_whose_own_links_are_slowest():
  """Hosts a and b, 2 ranks each, probed with 1 MB: a repeat's transfer
  is the least time a rank of its process set took (the last to arrive
  waited least). b's own links carry 0.4 Gbit/s, a's 2: inside a host is
  b's. Across hosts, ranks 0 and 2: 0.1 Gbit/s, 10% of a 1 Gbit/s link.
  The step's own allreduce, 40 Mbit/s, is slow against that link and
  against one of 120 Mbit/s, which the probe fills: there, its bytes are
  too few, not the network slow. A run with one level probes none, and
  its table says nothing of it."""
  def probed(host, local_rank, **seconds):
    return dict(window(host, local_rank, [0.2] * 3),
                link_probe=dict(bytes=1_000_000, seconds=seconds))
  inside, across = "inside a host", "across hosts"
  ranks = [probed("a", 0, **{inside: [0.004, 0.004, 0.006],
                             across: [0.1, 0.1, 0.1]}),
           probed("a", 1, **{inside: [0.008, 0.005, 0.004]}),
           probed("b", 0, **{inside: [0.02] * 3, across: [0.08] * 3}),
           probed("b", 1, **{inside: [0.03] * 3})]
  linked = dataclasses.replace(CPU, gradient_bytes=1_000_000,
                               link=scaling.Link.of(1, 0))
  report = step_report.across(ranks, (1, 3), linked)
  assert report["link"]["levels"] == [
      dict(level=inside, processes=2, hosts=2, host="b", bytes=1_000_000,
           bus_gbit=pytest.approx(0.4)),
      dict(level=across, processes=2, hosts=2, bytes=1_000_000,
           bus_gbit=pytest.approx(0.1))]
  assert step_table.table(report).endswith(
      "link levels: probed with 1 MB allreduces: inside a host 400 Mbit/s "
      "(b's 2 processes, the slowest of 2 hosts), across hosts 100 Mbit/s "
      "(2 processes, one a host; 10% of the link)")
  assert report["verdict"]["network"].endswith(
      "the network is slower than it should be (other traffic, its "
      "interfaces' settings, the route)")
  filled = step_report.across(ranks, (1, 3), dataclasses.replace(
      linked, link=scaling.Link.of(0.12, 0)))
  assert filled["verdict"]["network"].endswith(
      "the network does what the link allows (probed across hosts, 83%), "
      "but the step's allreduce moves too few bytes at a time to fill it")
  alone = step_report.across([window("a", 0, [0.002] * 3),
                              window("b", 0, [0.003] * 3)], (1, 3), linked)
  assert alone["link"]["levels"] == []
  assert "link levels" not in step_table.table(alone)


def test_ranks_late_by_turns_are_noise_not_stragglers():
  """On a busy machine each rank is late now and then: rank 1 in 3 steps
  of 20 and rank 0 in 2 others, by 20 ms. Neither is late twice as often
  as the other, and neither is named; late in 4 to rank 0's 2, rank 1
  is."""
  waits, own = [0.002] * 20, [0.002] * 20
  forward, own_forward = [0.004] * 20, [0.004] * 20
  for i in (3, 9, 15):  # rank 1 late: rank 0 waits
    waits[i], forward[i] = 0.022, 0.024
  for i in (5, 11):  # rank 0 late: rank 1 waits
    own[i], own_forward[i] = 0.022, 0.024
  def stragglers():
    return step_report.across(
        [window("a", 0, waits, own_forward), window("b", 0, own, forward)],
        (1, 20), CPU)["verdict"]["stragglers"]
  assert stragglers() == []
  waits[17], forward[17] = 0.022, 0.024
  [named] = stragglers()
  assert named.startswith("rank 1 computes longer")
  assert "it reached the allreduce last in 4 of 20 steps, by 20 ms" in named


def test_a_slow_node_and_a_rank_slow_half_the_time_are_both_named():
  """host1's ranks 40 ms late in every step, rank 1 on host0 100 ms late
  in 7 of 13: both named, the node first (the most late), each standing
  out against the ranks elsewhere."""
  steps = 13
  first = [0.042] * steps  # rank 0 waits for everyone
  rank1, rank1_forward = [0.042] * steps, [0.004] * steps
  host1, host1_forward = [0.002] * steps, [0.044] * steps
  for i in range(0, steps, 2):  # rank 1 last: the others wait longer
    first[i], rank1[i], rank1_forward[i] = 0.102, 0.002, 0.104
    host1[i] = 0.062
  report = step_report.across(
      [window("host0", 0, first), window("host0", 1, rank1, rank1_forward),
       window("host1", 0, host1, host1_forward),
       window("host1", 1, host1, host1_forward)], (1, 13), CPU)
  node, rank = report["verdict"]["stragglers"]
  assert node.startswith("node host1 computes longer")
  assert "together in 13 of 13 steps, by 40 ms a step" in node
  assert rank.startswith("rank 1 computes longer")
  assert "in 7 of 13 steps, by 100 ms a step" in rank


RECORDED = os.path.join(fixtures.REPO, "tests", "data",
                        "step_report_series.json")


def recorded_ranks(count, per_host, slowed_host=None, slowed_ms=30):
  """`count` ranks, `per_host` a host, with a real run's series
  (tests/data/step_report_series.json: two ranks, its rank 0 traced by
  TensorFlow's profiler): rank 0 its rank 0's, the others its rank 1's;
  the ranks of `slowed_host` compute `slowed_ms` longer in every third
  step, in which the others wait that much longer in the allreduce."""
  with open(RECORDED) as f:
    series = [rank["series"] for rank in json.load(f)["ranks"]]
  ranks = []
  for r in range(count):
    host = f"node{r // per_host}"
    own = series[min(r, 1)]
    calls = [{part: values[i] for part, values in own.items()}
             for i in range(len(own["forward"]))]
    for i in range(0, len(calls), 3):
      calls[i]["forward" if host == slowed_host else "communication"] += (
          slowed_ms / 1e3)
    ranks.append(step_report.of_rank(calls, host=host,
                                     local_rank=r % per_host,
                                     profiled=r == 0))
  return ranks


def test_the_table_of_many_ranks_stays_short_and_the_json_keeps_each():
  """16 ranks on 4 hosts, from a real run's series, node2's ranks 30 ms
  slower in every third step: the table shows the slowest ranks, the
  least busy and a line for the rest, then the hosts, the slow node first
  and named the straggler; 64 ranks on 16 hosts take one line more, for
  the hosts not shown. The JSON keeps every rank's series."""
  def report(count):
    return step_report.across(recorded_ranks(count, 4, "node2"), (6, 28),
                              settings(gradient_bytes=420_000))
  sixteen, sixty_four = report(16), report(64)
  assert len(sixteen["ranks"]) == 16
  assert all(len(rank["series"]["forward"]) == 23
             for rank in sixteen["ranks"])
  lines = step_table.table(sixteen).splitlines()
  many = step_table.table(sixty_four).splitlines()
  assert len(many) == len(lines) + 1 < 30, "\n".join(many)  # more hosts
  rows = [line.split()[0] for line in lines[1:7]]
  assert rows[:5] == sorted(rows[:5], key=int) and rows[5] == "..."
  assert {"8", "9", "10", "11"} <= set(rows[:5])  # node2's: the slowest
  assert lines[6].split()[1:4] == ["11", "more", "ranks:"]
  hosts = [line for line in lines if line.startswith("host ")]
  assert hosts[0].startswith("host node2: 4 ranks (8-11), step ")
  assert len(hosts) == step_table.SHOWN_HOSTS
  stragglers = [line for line in lines if line.startswith("a straggler")]
  assert [line.split(" computes")[0] for line in stragglers] == [
      "a straggler: node node2"]
  assert lines[-1].startswith("network: the allreduce's bus bandwidth ")
  assert many[-2].startswith("12 more hosts: busy ")
  # However many straggle, the table names the first few.
  crowded = dict(sixty_four, verdict=dict(
      sixty_four["verdict"], stragglers=[f"rank {r} ..." for r in range(7)]))
  named = [line for line in step_table.table(crowded).splitlines()
           if "straggler" in line and "profiler" not in line]
  assert named == [f"a straggler: rank {r} ..." for r in range(4)] + [
      "3 more stragglers (the report's JSON, verdict.stragglers)"]


@pytest.mark.parametrize("gbit, latency_us, hosts, expected", [
    # No link named: the gradients' bytes, within 1 and 16 MiB.
    (None, 0, 2, 1 << 20), (None, 0, 64, 1 << 20),
    # 100 Gbit/s, 5 us, 64 hosts: 9 x 64 x 5 us x 12.5 GB/s = 36 MB.
    (100, 5, 64, 36_000_000),
    # 1 Gbit/s, 50 us, 2 hosts: 9 x 2 x 50 us x 125 MB/s = 112.5 kB,
    # less than the gradients' 420 kB, less than 1 MiB: 1 MiB.
    (1, 50, 2, 1 << 20),
])
def test_the_link_probe_sends_what_the_links_bandwidth_sets(
    gbit, latency_us, hosts, expected):
  link = scaling.Link.of(gbit, latency_us) if gbit else None
  nbytes = link_levels.probe_bytes(420_000, hosts, link)
  assert nbytes == expected
  if link:  # the ring's time is 90% its bandwidth's, or more
    latency = 2 * (hosts - 1) * link.latency
    assert latency <= 0.1 * scaling.ring_allreduce_seconds(nbytes, hosts,
                                                           link) + 1e-12


def test_the_link_probe_takes_at_most_half_a_second_a_repeat():
  """94 MB of gradients over a 100 Mbit/s link between 2 hosts: the probe
  sends the 6.25 MB that take half a second, 12.5 MB/s x 0.5 s x 2 / 2."""
  link = scaling.Link.of(0.1, 20)
  assert link_levels.probe_bytes(94_000_000, 2, link) == 6_250_000
  assert scaling.ring_allreduce_seconds(6_250_000, 2, link) == (
      pytest.approx(0.5, rel=1e-3))
  # Without a link named, the 16 MiB that measured every link before.
  assert link_levels.probe_bytes(94_000_000, 2, None) == 16 << 20
  # 1 Mbit/s: 62.5 kB, not the 1 MiB that took 8 s a repeat.
  assert link_levels.probe_bytes(420_000, 2, scaling.Link.of(0.001, 20)) == (
      62_500)
