"""Flags: the MLPerf HPC log (--mlperf_log), and the submission it names."""
from absl import flags

# The MLPerf HPC benchmark whose rules the log follows (the engine's
# regression task; DeepCAM's, OC20's and OpenFold's closed divisions ask
# for hyperparameters of their own), and the divisions and system statuses,
# as the compliance checker's hpc rulesets spell them.
BENCHMARKS = ("cosmoflow",)
DIVISIONS = ("closed", "open")
STATUSES = ("onprem", "cloud", "preview", "research")

flags.DEFINE_string(
    "mlperf_log", "",
    "Rank 0 writes the run's MLPerf HPC log to this file, through the "
    "mlperf-logging package: init, staging, the run, each epoch and "
    "evaluation, eval_error (the validation MAE), the hyperparameters and "
    "whether --target was reached; a resumed run appends (it is then no "
    "valid submission). Check it with python -m "
    "mlperf_logging.compliance_checker --usage hpc --ruleset 3.0.0 FILE "
    "(docs/watching.md). Not with --elastic. Empty: none.")
flags.DEFINE_enum("mlperf_benchmark", "cosmoflow", BENCHMARKS,
                  "--mlperf_log: the benchmark the run is of "
                  "(submission_benchmark); CosmoFlow's rules are the ones "
                  "followed.",
                  case_sensitive=False)
flags.DEFINE_enum("mlperf_division", "closed", DIVISIONS,
                  "--mlperf_log: the division (closed: the reference's "
                  "hyperparameters only, e.g. --optimizer=sgd for "
                  "cosmoflow).",
                  case_sensitive=False)
flags.DEFINE_enum("mlperf_status", "onprem", STATUSES,
                  "--mlperf_log: the system's availability "
                  "(submission_status).",
                  case_sensitive=False)
flags.DEFINE_string("mlperf_org", "unspecified",
                    "--mlperf_log: the submitting organization "
                    "(submission_org).")
flags.DEFINE_string("mlperf_platform", "",
                    "--mlperf_log: the system's name, as in its system "
                    "description (submission_platform). Empty: this "
                    "host's name.")
flags.DEFINE_bool("mlperf_cache_clear", False,
                  "--mlperf_log: the job cleared the nodes' file caches "
                  "before the run, as the rules ask; the engine cannot, so "
                  "it logs what this says (cache_clear).")
