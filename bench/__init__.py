"""Benchmarks to rerun on new hardware: throughput against Keras `fit` and a
plain loop, time to accuracy, a recipe against Keras `fit`, the CPU
defaults, steps per call, the input pipeline, the allreduce against the
link, and the engine across revisions.

README.md lists every file with the question it answers and how to run it;
RESULTS.md has the current figures.
"""
