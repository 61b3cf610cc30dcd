"""Imports the engine before any test imports TensorFlow.

`engine/__init__.py` chooses TensorFlow's CPU kernels (oneDNN) and log level
through the environment, which TensorFlow reads once, early. Tests
that train in the pytest process then run the kernels users run, whichever
test file a worker happens to import first.
"""
import engine  # pylint: disable=unused-import
