"""What every part of the engine shares, without TensorFlow: the flags as
plain values (config.py), the errors a user can cause and their exit codes
(errors.py), builders by name and a user's `module:function` (registry.py,
user_code.py), the name of every file a run keeps in model_dir and their
small readers (run_files.py), and TensorFlow's import without the lines its
log level hides (quiet_import.py).

It is the bottom layer: it imports nothing else of the engine, so
`python -m engine.runs` and the config load in a fraction of a second.
"""
