"""A real PostgreSQL on the simulated hosts: the database that sweeps on
several hosts share (engine.sweep --storage=postgresql://...).

tests/simulated_hosts.py gives each host its network; this runs Debian's
PostgreSQL server on the first host, as a cluster runs its database on one
node: listening on that host's address, which every host reaches over the
simulated bridge, with a password (scram-sha-256) for the hosts' subnet,
and a database and user of Optuna's own. The test itself, outside the
hosts' networks, reads the study through the server's Unix socket, which
is a file in the cluster's directory and so crosses network namespaces.

A cluster of its own, never the machine's: initdb into a temporary
directory owned by the `postgres` user (the server refuses to run as
root), started and stopped by this harness, on a port of the first host's
network, where the machine's own 5432 (Debian's `main` cluster, running or
not) is another port. Everything is stopped and removed at the end, also
when a test fails.
"""
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Optional

from tests import simulated_hosts
from tests import timeouts

# Debian installs each major version's server here, off PATH.
BINARIES = "/usr/lib/postgresql/*/bin"
USER = "postgres"  # the server's, which Debian's package creates
PORT = 5432        # in the first host's network, not the machine's
DATABASE = "optuna"  # the study's database, and its owner's name


def binaries() -> Optional[str]:
  """The newest installed server's bin directory, or None."""
  found = [os.path.dirname(path)
           for path in glob.glob(os.path.join(BINARIES, "initdb"))]
  return max(found, key=_major, default=None)


def _major(bin_dir: str) -> int:
  version = os.path.basename(os.path.dirname(bin_dir))
  return int(version) if version.isdigit() else 0


def unavailable() -> Optional[str]:
  """Why a PostgreSQL cannot be simulated here, or None if it can."""
  if binaries() is None:
    return (f"a simulated PostgreSQL needs its server ({BINARIES}/initdb): "
            "apt-get install postgresql (scripts/setup.sh does, as root)")
  try:
    pwd.getpwnam(USER)
  except KeyError:
    return (f"a simulated PostgreSQL runs as the `{USER}` user, which "
            "Debian's postgresql package creates: apt-get install postgresql")
  return simulated_hosts.unavailable()


class SimulatedPostgres:
  """`with SimulatedPostgres(hosts) as db: ... --storage={db.url} ...`, on
  the first host of a running simulated_hosts.SimulatedHosts."""

  def __init__(self, hosts: simulated_hosts.SimulatedHosts):
    self.hosts = hosts
    self.password = secrets.token_hex(8)
    self._bin = binaries()
    self._user = pwd.getpwnam(USER)
    self._server = None
    self._dir = None

  @property
  def url(self) -> str:
    """The study's storage as the hosts reach it: TCP, with the password."""
    return (f"postgresql://{DATABASE}:{self.password}@"
            f"{simulated_hosts.SUBNET}.1:{PORT}/{DATABASE}")

  def local_url(self, database: str = DATABASE) -> str:
    """A database as this process reaches it: the Unix socket."""
    return f"postgresql://{USER}@/{database}?host={self._dir}&port={PORT}"

  def __enter__(self) -> "SimulatedPostgres":
    try:
      self._dir = tempfile.mkdtemp(prefix="simulated_postgres_")
      # The server's user owns the directory: its data and its socket.
      os.chown(self._dir, self._user.pw_uid, self._user.pw_gid)
      self._initdb()
      self._start()
      self._create_database()
    except BaseException:
      self.__exit__(None, None, None)
      raise
    return self

  def __exit__(self, *exc_info) -> None:
    if self._server is not None:
      # A fast shutdown: the sessions are ended, the cluster is removed.
      self._server.send_signal(signal.SIGINT)
      try:
        self._server.wait(timeout=timeouts.bound(30))
      except subprocess.TimeoutExpired:
        simulated_hosts.kill_group(self._server)
      self._server = None
    if self._dir:
      shutil.rmtree(self._dir, ignore_errors=True)

  def execute(self, statement: str, parameters=(),
              database: str = "postgres") -> None:
    """One statement as the superuser, through the socket (trusted: its
    directory admits root and the server's user alone), outside a
    transaction, as CREATE DATABASE must be."""
    import psycopg2  # pylint: disable=import-outside-toplevel
    connection = psycopg2.connect(host=self._dir, port=PORT, user=USER,
                                  dbname=database)
    try:
      connection.autocommit = True
      with connection.cursor() as cursor:
        cursor.execute(statement, parameters)
    finally:
      connection.close()

  def create_database(self, name: str) -> None:
    """Another database, empty, owned by the study's user."""
    self.execute(f'CREATE DATABASE "{name}" OWNER "{DATABASE}"')

  def log(self, lines: int = 10) -> str:
    """The server's last lines, for a failing test's message."""
    try:
      with open(os.path.join(self._dir, "server.log"), errors="replace") as f:
        return "".join(f.readlines()[-lines:])
    except OSError:
      return ""

  # Set-up.

  def _as_user(self, command: list[str]) -> list[str]:
    """`command` as the server's user; setpriv execs it (no process in
    between, unlike runuser), so the server is the process signalled."""
    return ["setpriv", f"--reuid={self._user.pw_uid}",
            f"--regid={self._user.pw_gid}", "--clear-groups", *command]

  def _initdb(self) -> None:
    data = os.path.join(self._dir, "data")
    result = subprocess.run(
        self._as_user([os.path.join(self._bin, "initdb"), "-D", data,
                       f"--username={USER}", "--encoding=UTF8",
                       "--locale=C", "--no-sync", "--auth=trust"]),
        capture_output=True, text=True, timeout=timeouts.bound(60))
    if result.returncode:
      raise RuntimeError(f"initdb failed: {result.stderr.strip()}")
    # The socket, to anyone who can enter the directory; the hosts'
    # subnet, to the study's user with its password.
    with open(os.path.join(data, "pg_hba.conf"), "w") as f:
      f.write("local all all trust\n"
              f"host all {DATABASE} {simulated_hosts.SUBNET}.0/24 "
              "scram-sha-256\n")

  def _start(self) -> None:
    with open(os.path.join(self._dir, "server.log"), "wb") as log:
      self._server = subprocess.Popen(
          self.hosts.on_host(0, self._as_user([
              os.path.join(self._bin, "postgres"), "-D",
              os.path.join(self._dir, "data"), "-p", str(PORT),
              "-c", f"listen_addresses={simulated_hosts.SUBNET}.1",
              "-c", f"unix_socket_directories={self._dir}",
              # A cluster thrown away at the end: no flushes to wait for.
              "-c", "fsync=off"])),
          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    seconds = timeouts.bound(30)
    deadline = time.monotonic() + seconds
    import psycopg2  # pylint: disable=import-outside-toplevel
    while True:
      try:
        self.execute("SELECT 1")
        return
      except psycopg2.OperationalError as e:
        if self._server.poll() is not None:
          raise RuntimeError(f"postgres stopped: {self.log()}") from None
        if time.monotonic() > deadline:
          raise RuntimeError(f"postgres not accepting connections after "
                             f"{seconds:.0f} s: {e}") from None
        time.sleep(0.2)

  def _create_database(self) -> None:
    self.execute(f'CREATE ROLE "{DATABASE}" LOGIN PASSWORD %s',
                 (self.password,))
    self.create_database(DATABASE)
