"""Sweeps, without TensorFlow: a search space of engine flags (space.py),
the Optuna study that searches it and where it is kept (study.py), how a
trial is launched and how it ended (trials.py), and the sweep that starts
trials while its budget lasts and tells the study how each ended
(sweeper.py). engine/sweep.py is the command; engine/loop/trial.py is a
trial's side, in the train loop."""
