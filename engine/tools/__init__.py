"""Command-line tools beside training: `python -m engine.tools.NAME`."""
