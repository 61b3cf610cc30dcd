"""bench/ kept to what a maintainer reruns, and bench/RESULTS.md to the
figures that stand (issue 66).

Benchmarks accrete: every question asked once leaves a script and a
section of figures behind, and figures that still stand get lost among
superseded rounds (RESULTS.md had reached 1,374 lines, bench/ 3,902 lines
of Python, one script of which no longer imported). These limits make
growth a decision: past them, a finished experiment moves to RESULTS.md's
history (its answer in a few lines, and the commit whose RESULTS.md has
the full tables), and a script whose question is answered leaves the tree
(git keeps it, at the commit its history entry names). Counted as `wc -l`
counts, without TensorFlow.
"""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_BENCH_PYTHON_LINES = 3500
MAX_RESULTS_LINES = 900


def _lines(path: pathlib.Path) -> int:
  return path.read_text(encoding="utf-8").count("\n")


def outgrown(root) -> list[str]:
  """What of `root`'s bench/ is past its room: its *.py together over
  MAX_BENCH_PYTHON_LINES, RESULTS.md over MAX_RESULTS_LINES; each with
  its count and what to do about it."""
  bench = pathlib.Path(root, "bench")
  found = []
  python = sum(_lines(path) for path in sorted(bench.glob("*.py")))
  if python > MAX_BENCH_PYTHON_LINES:
    found.append(
        f"bench/*.py: {python} lines, more than {MAX_BENCH_PYTHON_LINES}: "
        "remove the scripts whose question is answered (their section "
        "moved to RESULTS.md's history, naming the commit that keeps the "
        "script) and dead code")
  results = _lines(bench / "RESULTS.md")
  if results > MAX_RESULTS_LINES:
    found.append(
        f"bench/RESULTS.md: {results} lines, more than {MAX_RESULTS_LINES}: "
        "move finished experiments, older rounds and superseded races to "
        "its history, a few lines each, with the commit whose RESULTS.md "
        "has their full tables")
  return found


def test_bench_keeps_to_what_is_rerun_and_its_results_to_what_stands(
    tmp_path):
  found = outgrown(ROOT)
  assert not found, "bench/ has outgrown its room:\n" + "\n".join(found)
  # The check finds both, one line past each limit; at the limits, nothing.
  bench = tmp_path / "bench"
  bench.mkdir()
  (bench / "a.py").write_text("x = 1\n" * MAX_BENCH_PYTHON_LINES)
  (bench / "b.py").write_text("y = 2\n")
  (bench / "RESULTS.md").write_text("figure\n" * (MAX_RESULTS_LINES + 1))
  found = outgrown(tmp_path)
  assert len(found) == 2, found
  assert found[0].startswith(
      f"bench/*.py: {MAX_BENCH_PYTHON_LINES + 1} lines"), found
  assert found[1].startswith(
      f"bench/RESULTS.md: {MAX_RESULTS_LINES + 1} lines"), found
  (bench / "b.py").unlink()
  (bench / "RESULTS.md").write_text("figure\n" * MAX_RESULTS_LINES)
  assert outgrown(tmp_path) == []
