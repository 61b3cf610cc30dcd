"""Run by tests/test_cli.py: `python -m engine.train ARGS` for one ARGS after
another, all in this process, as tests/workers/fuzz_cases.py runs its cases:
a new process per command line would spend seconds importing TensorFlow.

  python -m tests.workers.engine_server

Reads one JSON list of arguments per line on stdin, runs the engine's entry
point on each with file descriptors 1 and 2 captured (fuzz_cases.run_engine),
and answers each with one JSON line on stdout: the exit code a process would
have had, its stdout, and its stderr, where an exception that escaped
`app.run` appears as the traceback a process would have printed.
"""
import json
import os
import sys
import tempfile

from tests.workers import fuzz_cases


def main() -> None:
  # Answers go to the original stdout; anything else written to fd 1
  # between runs goes to stderr, so it cannot be taken for an answer.
  answers = os.dup(1)
  os.dup2(2, 1)
  # Removed when stdin ends (TrainCommands.close).
  with tempfile.TemporaryDirectory(prefix="engine_server_") as capture:
    for line in sys.stdin:
      run = fuzz_cases.run_engine(json.loads(line), capture)
      stderr = run.stderr
      if run.escaped:
        stderr += f"Traceback (escaped app.run): {run.escaped}\n"
      os.write(answers, (json.dumps({"code": run.code, "stdout": run.stdout,
                                     "stderr": stderr}) + "\n").encode())


if __name__ == "__main__":
  main()
