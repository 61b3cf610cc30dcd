r"""Hosts simulated on one machine: network namespaces, each with its own
hostname, address and sshd, so that horovodrun runs a real multi-host job.

Each host is a network namespace with a veth pair to a bridge (in a switch
namespace of its own), an address in 10.77.0.0/24, and an sshd on a
private port that accepts a key generated for the run. Its processes also
get their own UTS namespace (hostname `host<i>`) and mount namespace, in
which a generated hosts file is bind-mounted on /etc/hosts (every host
resolves every host name to its veth address) and a passwd file with
sshd's privilege-separation user on /etc/passwd.

Horovod needs the names to resolve to the training interface. With the
machine's one hostname, which resolves to 127.0.0.1, Horovod 0.28.1's Gloo
process-set context bound to that address despite --network-interface, and
the remote rank could not connect (BUILD.md, "Hostnames and interfaces").

Nothing outside the namespaces is touched: no address, route or interface
of the machine, no /etc/hosts or /etc/passwd, no ~/.ssh (ssh runs through a wrapper that
keeps host keys out of known_hosts). Everything is removed at the end, also
when the command fails or this script is interrupted.

By hand (as root), a command run on the first host, with {hosts},
{ssh_port}, {ssh_key} and {interface} filled in:

  .venv/bin/python tests/simulated_hosts.py --hosts=2 -- \
      .venv/bin/horovodrun --gloo -np 2 -H {hosts} --ssh-port {ssh_port} \
      --ssh-identity-file {ssh_key} --network-interface {interface} \
      .venv/bin/python -m engine.train --epochs=1

`--link=100mbit` (any rate in mbit or gbit) shapes each host's egress
with tc first (`SimulatedHosts.shape`).
"""
import argparse
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

from tests import shaped_links
from tests import timeouts

SUBNET = "10.77.0"
_INSTANCES = itertools.count()  # several at once in one process
INTERFACE = "eth0"
SSHD_PORT = 2222
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# setup.sh unpacks Debian's openssh-server into the venv rather than
# installing it, which would start a system-wide sshd. The venv running the
# tests, wherever it is: VENV=dir, or a git worktree's tests run with the
# main checkout's .venv, have none at REPO/.venv.
SSHD = os.path.join(sys.prefix, "openssh", "usr", "sbin", "sshd")


def unavailable() -> Optional[str]:
  """Why hosts cannot be simulated here, or None if they can."""
  if os.geteuid() != 0:
    return "simulating hosts needs root (network namespaces, mounts)"
  for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
    if not shutil.which(tool):
      return f"simulating hosts needs `{tool}`"
  if not os.access(SSHD, os.X_OK):
    return f"no sshd at {SSHD}: run scripts/setup.sh"
  probe = f"hvdprobe{os.getpid()}"
  created = subprocess.run(["ip", "netns", "add", probe], capture_output=True,
                           text=True)
  if created.returncode:
    return f"`ip netns add` fails here: {created.stderr.strip()}"
  subprocess.run(["ip", "netns", "del", probe], capture_output=True)
  return None


class SimulatedHosts:
  """`with SimulatedHosts(2) as hosts: hosts.run(["horovodrun", ...])`."""

  def __init__(self, count: int = 2):
    self.names = [f"host{i}" for i in range(count)]
    self._prefix = f"hvd{os.getpid()}-{next(_INSTANCES)}-"
    self._switch = self._prefix + "sw"
    self._namespaces = []
    self._sshds = []
    self._dir = None

  @property
  def ssh_port(self) -> int:
    return SSHD_PORT

  @property
  def ssh_key(self) -> str:
    return os.path.join(self._dir, "id_ed25519")

  @property
  def interface(self) -> str:
    return INTERFACE

  def __enter__(self) -> "SimulatedHosts":
    try:
      self._create()
    except BaseException:
      self.__exit__(None, None, None)
      raise
    return self

  def __exit__(self, *exc_info) -> None:
    for sshd in self._sshds:
      kill_group(sshd)
    for namespace in reversed(self._namespaces):
      # Anything still running in a namespace (a stray rank) goes with it.
      pids = subprocess.run(["ip", "netns", "pids", namespace],
                            capture_output=True, text=True).stdout.split()
      for pid in pids:
        try:
          os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
          pass
      subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    if self._dir:
      shutil.rmtree(self._dir, ignore_errors=True)

  def run(self, command: list[str], *, host: int = 0, env=None,
          timeout: float = 600) -> subprocess.CompletedProcess:
    """`command` on host `host`, as a process of that host; `timeout` in
    nominal seconds (tests/timeouts.py)."""
    return subprocess.run(self.on_host(host, command), env=self._env(env),
                          text=True, capture_output=True,
                          timeout=timeouts.bound(timeout),
                          start_new_session=True)

  def start(self, command: list[str], *, host: int = 0, env=None,
            **popen_args) -> subprocess.Popen:
    """`command` on host `host` in the background, in a session of its own
    (os.killpg signals it; kill_group ends it)."""
    return subprocess.Popen(self.on_host(host, command), env=self._env(env),
                            start_new_session=True, **popen_args)

  def _env(self, env) -> dict:
    env = dict(env or os.environ)
    # ssh through the wrapper, which keeps known_hosts out of ~/.ssh.
    env["PATH"] = os.path.join(self._dir, "bin") + ":" + env.get("PATH", "")
    return env

  # Set-up.

  def _create(self) -> None:
    self._dir = tempfile.mkdtemp(prefix="simulated_hosts_")
    self._write_files()
    self._add_namespace(self._switch)
    _ip(self._switch, "link", "add", "br0", "type", "bridge")
    _ip(self._switch, "link", "set", "br0", "up")
    for i, _ in enumerate(self.names):
      namespace = f"{self._prefix}{i}"
      self._add_namespace(namespace)
      # Both ends are created inside the namespaces: the machine's own
      # network never sees them.
      subprocess.run(["ip", "link", "add", INTERFACE, "netns", namespace,
                      "type", "veth", "peer", "name", f"port{i}", "netns",
                      self._switch], check=True, capture_output=True)
      _ip(self._switch, "link", "set", f"port{i}", "master", "br0", "up")
      _ip(namespace, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", INTERFACE)
      _ip(namespace, "link", "set", INTERFACE, "up")
      _ip(namespace, "link", "set", "lo", "up")
    for i, _ in enumerate(self.names):
      self._start_sshd(i)

  def _add_namespace(self, namespace: str) -> None:
    subprocess.run(["ip", "netns", "add", namespace], check=True,
                   capture_output=True)
    self._namespaces.append(namespace)

  def _write_files(self) -> None:
    d = self._dir
    # sshd's privilege separation user, which installing openssh-server
    # would add to the machine's /etc/passwd; here only the hosts see it.
    with open("/etc/passwd") as f:
      users = f.read()
    if not any(line.startswith("sshd:") for line in users.splitlines()):
      users += "sshd:x:64999:65534::/run/sshd:/usr/sbin/nologin\n"
    with open(os.path.join(d, "passwd"), "w") as f:
      f.write(users)
    with open(os.path.join(d, "hosts"), "w") as f:
      f.write("127.0.0.1 localhost\n")
      for i, name in enumerate(self.names):
        f.write(f"{SUBNET}.{i + 1} {name}\n")
    for key in ("id_ed25519", "host_key"):
      subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                      os.path.join(d, key)], check=True, capture_output=True)
    shutil.copy(os.path.join(d, "id_ed25519.pub"),
                os.path.join(d, "authorized_keys"))
    with open(os.path.join(d, "sshd_config"), "w") as f:
      f.write(f"Port {SSHD_PORT}\n"
              f"HostKey {d}/host_key\n"
              f"AuthorizedKeysFile {d}/authorized_keys\n"
              "PermitRootLogin prohibit-password\n"
              "PasswordAuthentication no\n"
              "KbdInteractiveAuthentication no\n"
              "UsePAM no\n"
              "StrictModes no\n")
    with open(os.path.join(d, "ssh_config"), "w") as f:
      # Our sshd's port and key for any ssh through the wrapper, so that
      # a launcher run on a host (a SLURM job's horovodrun, mpirun) needs
      # no options to reach the others.
      f.write("Host *\n"
              f"  Port {SSHD_PORT}\n"
              f"  IdentityFile {d}/id_ed25519\n"
              "  UserKnownHostsFile /dev/null\n"
              "  StrictHostKeyChecking no\n"
              "  LogLevel ERROR\n")
    os.makedirs(os.path.join(d, "bin"))
    wrapper = os.path.join(d, "bin", "ssh")
    with open(wrapper, "w") as f:
      f.write(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {d}/ssh_config "
              "\"$@\"\n")
    os.chmod(wrapper, 0o755)

  def on_host(self, i: int, command: list[str]) -> list[str]:
    """`command` in host i's network, hostname and hosts file."""
    setup = (f"hostname {self.names[i]} && "
             f"mount --bind {self._dir}/hosts /etc/hosts && "
             f"mount --bind {self._dir}/passwd /etc/passwd && "
             # sshd's privilege separation directory, in this host only.
             "mount -t tmpfs tmpfs /run && mkdir -m 755 /run/sshd && "
             'exec "$@"')
    return ["ip", "netns", "exec", f"{self._prefix}{i}", "unshare", "--uts",
            "--mount", "--propagation", "private", "sh", "-c", setup, "sh",
            *command]

  def shape(self, link: str, burst_ms: float = 2.0) -> None:
    """Every host's egress shaped to `link` (a rate such as 100mbit:
    tests/shaped_links.py; tc's tbf, a bucket of `burst_ms` at the rate),
    inside its namespace; `unshaped` removes the shaping."""
    rate = shaped_links.link_rate(link)
    for i, _ in enumerate(self.names):
      qdisc = ["tc", "qdisc"]
      if rate is None:
        qdisc += ["del", "dev", self.interface, "root"]
      else:
        qdisc += ["replace", "dev", self.interface, "root", "tbf", "rate",
                  f"{rate:.0f}bit", "burst",
                  str(shaped_links.burst_bytes(rate, burst_ms)),
                  "latency", "100ms"]
      done = subprocess.run(self.on_host(i, qdisc), capture_output=True,
                            text=True)
      # Deleting the root qdisc of an unshaped interface fails: nothing to
      # do.
      if done.returncode and rate is not None:
        raise RuntimeError(f"{' '.join(qdisc)} on {self.names[i]} failed: "
                           f"{done.stderr.strip()}")

  def _start_sshd(self, i: int) -> None:
    sshd = subprocess.Popen(
        self.on_host(i, [SSHD, "-D", "-e", "-f",
                          os.path.join(self._dir, "sshd_config"),
                          "-o", f"PidFile={self._dir}/sshd{i}.pid"]),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    self._sshds.append(sshd)
    # Ready when the first host can log in to it.
    login = self.on_host(0, ["ssh", "-F", f"{self._dir}/ssh_config",
                              "-i", self.ssh_key, "-p", str(SSHD_PORT),
                              "-o", "BatchMode=yes", self.names[i], "true"])
    seconds = timeouts.bound(20)
    deadline = time.monotonic() + seconds
    while subprocess.run(login, capture_output=True).returncode:
      if sshd.poll() is not None:
        raise RuntimeError(f"sshd on {self.names[i]} stopped: "
                           f"{sshd.stderr.read().strip()}")
      if time.monotonic() > deadline:
        raise RuntimeError(f"sshd on {self.names[i]} did not accept a login "
                           f"within {seconds:.0f} s")
      time.sleep(0.2)


def _ip(namespace: str, *args: str) -> None:
  subprocess.run(["ip", "-n", namespace, *args], check=True,
                 capture_output=True)


def kill_group(process: subprocess.Popen) -> None:
  """Kills a daemon started in a session of its own, with its children."""
  try:
    os.killpg(process.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  process.wait()


def command_line_main(doc: str, name: str, unavailable_here, run) -> int:
  """`--hosts=N [--link=RATE] -- COMMAND...` by hand: `run(hosts,
  command, link)` gives the CompletedProcess whose output and exit code
  are passed on; `name: reason` and exit 2 where `unavailable_here()`
  gives a reason."""
  parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
  parser.add_argument("--hosts", type=int, default=2)
  parser.add_argument("--link", default="unshaped",
                      help="each host's egress shaped to this rate (tc): "
                           "100mbit, 1gbit, ...")
  parser.add_argument("command", nargs=argparse.REMAINDER)
  args = parser.parse_args()
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  try:
    shaped_links.link_rate(args.link)
  except ValueError as e:
    parser.error(str(e).replace("--links", "--link"))
  reason = unavailable_here()
  if reason:
    print(f"{name}: {reason}", file=sys.stderr)
    return 2
  # SIGTERM and SIGINT go through the context managers' __exit__ too.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  result = run(args.hosts, command, args.link)
  sys.stdout.write(result.stdout)
  sys.stderr.write(result.stderr)
  return result.returncode


def _run_on_first_host(count: int, command: list[str], link: str):
  with SimulatedHosts(count) as hosts:
    hosts.shape(link)
    values = dict(hosts=",".join(f"{n}:1" for n in hosts.names),
                  ssh_port=hosts.ssh_port, ssh_key=hosts.ssh_key,
                  interface=hosts.interface)
    return hosts.run([part.format(**values) for part in command])


if __name__ == "__main__":
  sys.exit(command_line_main(__doc__, "simulated_hosts", unavailable,
                             _run_on_first_host))
