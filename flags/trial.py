"""Flags: the sweep a run is a trial of (engine.sweep sets them)."""
from absl import flags

flags.DEFINE_string(
    "trial_study_dir", "",
    "With --trial_number: this run is that trial of the sweep whose study "
    "directory this is (python -m engine.sweep sets both, docs/sweeps.md). "
    "Rank 0 reports the deciding figure (--best_metric) to the study after "
    "each evaluated epoch, and the run stops there, saved, when the study's "
    "pruner prunes it. Empty: no sweep.")
flags.DEFINE_integer(
    "trial_number", -1,
    "With --trial_study_dir: the trial's number in its study. -1: none.",
    lower_bound=-1)
