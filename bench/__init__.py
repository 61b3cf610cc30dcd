"""Benchmarks to rerun on new hardware: throughput against Keras `fit` and a
plain loop, time to accuracy, the input pipeline, the step's overheads and
the CPU defaults.

README.md lists every file with the question it answers and how to run it;
RESULTS.md has the current figures.
"""
