from absl import logging

from engine.loop import progress


def run(mode, chief=True, steps=20, per_call=1):
  bar = progress.Progress(mode=mode, chief=chief, steps_per_epoch=steps,
                          epochs=3, global_batch=64)
  bar.start_epoch(1)
  for done in range(per_call, steps + 1, per_call):
    bar.step(done)
  return bar


def test_log_mode_writes_a_line_per_tenth_of_the_epoch(monkeypatch):
  lines = []
  monkeypatch.setattr(logging, "info", lambda fmt, *a: lines.append(fmt % a))
  run("log")
  assert len(lines) == 10
  assert lines[-1].startswith("epoch 2/3 step 20/20, ")


def test_calls_of_several_steps_log_a_line_per_tenth_passed(monkeypatch):
  lines = []
  monkeypatch.setattr(logging, "info", lambda fmt, *a: lines.append(fmt % a))
  run("log", steps=40, per_call=5)  # a tenth: 4 steps
  assert [line.split(",")[0] for line in lines] == [
      f"epoch 2/3 step {done}/40" for done in (5, 10, 15, 20, 25, 30, 35, 40)]


def test_bar_mode_draws_a_keras_progress_bar(capsys):
  run("bar")
  out = capsys.readouterr().out
  assert "20/20" in out and "[" in out


def test_auto_is_log_lines_when_output_is_not_a_terminal(capsys):
  assert run("auto").mode == "log"  # pytest captures: not a terminal


def test_only_the_chief_shows_progress(capsys, monkeypatch):
  lines = []
  monkeypatch.setattr(logging, "info", lambda fmt, *a: lines.append(fmt))
  assert run("bar", chief=False).mode == "none"
  assert run("log", chief=False).mode == "none"
  assert not lines and not capsys.readouterr().out


def test_a_resumed_epochs_rate_counts_only_the_steps_run(monkeypatch):
  lines = []
  monkeypatch.setattr(logging, "info", lambda fmt, *a: lines.append(a))
  clock = iter([100.0, 102.0])
  monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
  bar = progress.Progress(mode="log", chief=True, steps_per_epoch=20,
                          epochs=3, global_batch=64)
  bar.start_epoch(1, first_step=16)
  bar.step(18)  # 2 steps of 64 in 2 s
  assert lines[-1][-1] == 64.0
