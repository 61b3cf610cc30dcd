"""Throughput benchmark: the engine against Keras `fit` and a plain loop.

`bench/throughput.py` runs everything and reports; `keras_fit.py` and
`plain_loop.py` are the workers it launches next to `engine.train`. README.md
says what is measured and how to run it.
"""
