"""Errors a user can cause, reported in one line at the entry point."""


class UserError(Exception):
  """Bad input from the user: a flag, a file or a checkpoint.

  The message names the flag, file or checkpoint and says what to do. The
  entry point prints it as one line and exits non-zero; a traceback would only
  bury that line (N times over under horovodrun).
  """
