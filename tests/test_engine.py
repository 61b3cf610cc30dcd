"""`import engine` (engine/__init__.py): the settings TensorFlow reads once,
made before it reads them, and its import without the notices that
TF_CPP_MIN_LOG_LEVEL hides; and how the tree's modules (engine/, flags/,
models/) import each other: no cycles, and their packages in layers."""
import ast
import os
import pathlib
import shutil
import subprocess

import pytest

from engine.core import quiet_import
from tests import fixtures
from tests import timeouts

KERAS = ("import engine, keras; "
         "print(keras.__version__.split('.')[0], keras.backend.backend(), "
         "keras.Model.__module__.split('.')[0])")


def test_the_engines_keras_is_keras_3_on_tensorflow_whatever_the_user_set():
  ran = fixtures.launch(["-c", KERAS], env={"KERAS_BACKEND": "jax",
                                            "TF_USE_LEGACY_KERAS": "1"})
  assert ran.returncode == 0, ran.stderr
  assert ran.stdout == "3 tensorflow keras\n"
  # tf.keras is the same Keras: TF_USE_LEGACY_KERAS is not the engine's.
  same = fixtures.launch(["-c", "import engine, keras, tensorflow as tf; "
                          "print(tf.keras.Model is keras.Model)"])
  assert same.stdout == "True\n", same.stderr


# A fit script's TensorFlow runs before the engine sets the thread pools:
# the threads its first op made, counted.
THREADS = ("import os, engine, tensorflow as tf; "
           "a = tf.ones((256, 256)); tf.matmul(a, a).numpy(); "
           "print(os.environ.get('TF_NUM_INTRAOP_THREADS'), "
           "len(os.listdir('/proc/self/task')))")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_under_a_launcher_a_scripts_tensorflow_takes_its_share_of_cores():
  cores = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))

  def launched(**env):
    ran = subprocess.run(["taskset", "-c", cores, fixtures.PYTHON, "-c",
                          THREADS], cwd=fixtures.REPO,
                         env=fixtures.engine_env(**env), text=True,
                         capture_output=True, timeout=timeouts.bound(120))
    assert ran.returncode == 0, ran.stderr
    setting, threads = ran.stdout.split()
    return setting, int(threads)
  # Of 2 cores, each of 2 processes gets one thread in each pool, where
  # TensorFlow alone takes both cores in both; a user's own setting stays.
  share, threads = launched(HOROVOD_LOCAL_SIZE="2")
  alone, more = launched()
  assert (share, alone) == ("1", "None") and more >= threads + 2
  assert launched(HOROVOD_LOCAL_SIZE="2", TF_NUM_INTRAOP_THREADS="2",
                  TF_NUM_INTEROP_THREADS="2") == ("2", more)


def test_tensorflows_import_prints_nothing_that_its_log_level_hides():
  # (fixtures.launch sets TF_CPP_MIN_LOG_LEVEL=2, as users' runs have it)
  quiet = fixtures.launch(["-c", "import engine, tensorflow"],
                          env={"TF_ENABLE_ONEDNN_OPTS": "1"})
  assert quiet.returncode == 0
  assert quiet.stderr == ""
  # What TensorFlow 2.21 prints before abseil's logging is initialized,
  # shown where the user asks for everything.
  everything = subprocess.run(
      [fixtures.PYTHON, "-c", "import engine, tensorflow"], cwd=fixtures.REPO,
      env=dict(fixtures.engine_env(), TF_CPP_MIN_LOG_LEVEL="0",
               TF_ENABLE_ONEDNN_OPTS="1"),
      text=True, capture_output=True, timeout=timeouts.bound(300))
  assert everything.returncode == 0
  assert "oneDNN custom operations are on" in everything.stderr


def test_a_cuda_builds_no_driver_error_alone_is_dropped(capfd):
  # What TensorFlow's CUDA build logs on a host with no NVIDIA driver, as
  # the import asks for its GPUs (engine/core/quiet_import.py): dropped;
  # an error beside it is not.
  no_driver = ("E0000 00:00:1796354361.880407   16514 cuda_platform.cc:52] "
               "failed call to cuInit: INTERNAL: CUDA error: Failed call to "
               "cuInit: UNKNOWN ERROR (303)\n")
  other = "E0000 00:00:1796354361.880500   16514 cuda_dnn.cc:8] other\n"
  # pylint: disable-next=protected-access
  with quiet_import._standard_error_filtered(
      2, dropped=quiet_import._NO_DRIVER):  # pylint: disable=protected-access
    os.write(2, no_driver.encode())
    os.write(2, other.encode())
  assert capfd.readouterr().err == other


# The tree's packages whose imports are checked: the engine, its flags and
# its models.
PACKAGES = ("engine", "flags", "models")


def tree_imports(root: str, *, in_functions: bool = False
                 ) -> dict[str, set[str]]:
  """Each module of the PACKAGES under `root` -> the modules of theirs it
  imports when imported (module-level imports; those inside functions run
  later), and with `in_functions` also those its functions import."""
  modules = {}
  for package in PACKAGES:
    for directory, _, files in os.walk(os.path.join(root, package)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(directory, name)
          module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
          modules[module.removesuffix(".__init__")] = path
  graph = {}
  for module, path in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read())
    imported = set()
    for node in ast.walk(tree) if in_functions else tree.body:
      if isinstance(node, ast.Import):
        imported |= {alias.name for alias in node.names}
      elif isinstance(node, ast.ImportFrom) and node.module:
        imported |= {f"{node.module}.{alias.name}" if
                     f"{node.module}.{alias.name}" in modules else node.module
                     for alias in node.names}
    graph[module] = (imported & modules.keys()) - {module}
  return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
  """A cycle of imports in `graph` (its modules in order), or []."""
  done, path = set(), []

  def visit(module):
    if module in path:
      return path[path.index(module):] + [module]
    if module in done:
      return []
    path.append(module)
    for imported in sorted(graph[module]):
      cycle = visit(imported)
      if cycle:
        return cycle
    path.pop()
    done.add(module)
    return []

  for module in sorted(graph):
    cycle = visit(module)
    if cycle:
      return cycle
  return []


def test_a_run_outside_a_sweep_loads_neither_optuna_nor_sqlalchemy():
  """Each process of a run would pay their import at start-up for a
  trial's reports it never makes."""
  assert fixtures.packages_imported_by(
      "engine.train", {"optuna", "sqlalchemy"}) == []


def test_the_engines_modules_import_each_other_without_cycles(tmp_path):
  graph = tree_imports(fixtures.REPO)
  assert len(graph) > 40 and graph["engine.train"] >= {"engine.loop.actions",
                                                        "engine.build"}
  assert import_cycle(graph) == []
  # The check finds one: a module that imports one importing it.
  (tmp_path / "engine").mkdir()
  (tmp_path / "engine" / "a.py").write_text("from engine import b\n")
  (tmp_path / "engine" / "b.py").write_text("import os\nimport engine.a\n")
  assert import_cycle(tree_imports(str(tmp_path))) == [
      "engine.a", "engine.b", "engine.a"]


# The tree's packages from the bottom up (docs/architecture.md's picture): a module
# imports from its own package and those below it. models/ sits on core/
# alone: a model is Keras, with the engine's errors and registry, and the
# tasks build models. flags/ sits above engine/'s packages, whose choices
# its flags name, and turns the parsed flags into core's TrainConfig for
# the commands above it (engine/*.py: train, build, evaluate, ...), which
# with engine/tools/ may import any.
LAYERS = ("core", "models", "sweeps", "distributed", "datasets", "tasks",
          "compute", "records", "loop", "flags")
COMMANDS = "commands"


def layer_of(module: str) -> str:
  """The layer of module `module` (engine.loop.loop -> "loop", models.wrn
  -> "models"). `engine` itself, which every import of the engine runs
  first, counts as the bottom layer's."""
  parts = module.split(".")
  if parts[0] != "engine":
    return parts[0]
  if len(parts) == 1:
    return LAYERS[0]
  return parts[1] if len(parts) > 2 or parts[1] in LAYERS else COMMANDS


def back_arrows(graph: dict[str, set[str]]) -> list[str]:
  """The imports in `graph` of a module from a layer above its own, as
  "importer -> imported"."""
  order = {layer: i for i, layer in enumerate(LAYERS)}
  order[COMMANDS] = len(LAYERS)
  return sorted(f"{module} -> {imported}"
                for module, imports in graph.items() for imported in imports
                if order.get(layer_of(imported), len(LAYERS)) >
                order.get(layer_of(module), len(LAYERS)))


def test_the_engines_packages_import_only_from_layers_below_their_own(
    tmp_path):
  graph = tree_imports(fixtures.REPO, in_functions=True)
  packages = {layer_of(module) for module in graph} - {COMMANDS}
  # Each package has its place: a new one must be given one here.
  assert packages == set(LAYERS) | {"tools"}
  assert graph["engine.loop.loop"] >= {"engine.records.report"}
  # (loop.py's divergence handling, and its import of errors, moved)
  assert graph["engine.loop.divergence"] >= {"engine.core.errors"}
  # One arrow up is the front door's: `engine.fit`, a fit script's entry,
  # which engine/__init__.py imports when a script first asks for it.
  assert back_arrows(graph) == ["engine -> engine.fit_script"]
  # The check finds one: the bottom layer importing from the top, in a
  # function.
  (tmp_path / "engine" / "core").mkdir(parents=True)
  (tmp_path / "engine" / "core" / "errors.py").write_text(
      "def f():\n  from engine import train\n")
  (tmp_path / "engine" / "train.py").write_text(
      "from engine.core import errors\n")
  assert back_arrows(tree_imports(str(tmp_path), in_functions=True)) == [
      "engine.core.errors -> engine.train"]


def test_flags_and_models_sit_in_the_layers_and_a_planted_upward_import_fails(
    tmp_path):
  graph = tree_imports(fixtures.REPO, in_functions=True)
  assert graph["flags"] >= {"flags.data", "engine.core.config"}
  assert "engine.core.errors" in graph["models.wrn"]
  assert graph["engine.tasks"] >= {"models"}
  # A copy of the tree, with an upward import planted in each of its
  # bottom layers: found, and nothing else.
  for package in PACKAGES:
    shutil.copytree(os.path.join(fixtures.REPO, package), tmp_path / package,
                    ignore=shutil.ignore_patterns("__pycache__"))
  planted = {"engine/core/config.py": "import flags\n",
             "engine/core/errors.py": "def f():\n  import engine.loop\n",
             "models/wrn.py": "from engine import distributed\n",
             "flags/data.py": "from engine import train\n"}
  for path, line in planted.items():
    with open(tmp_path / path, "a") as f:
      f.write(line)
  assert back_arrows(tree_imports(str(tmp_path), in_functions=True)) == [
      "engine -> engine.fit_script",  # the front door's (above)
      "engine.core.config -> flags", "engine.core.errors -> engine.loop",
      "flags.data -> engine.train", "models.wrn -> engine.distributed"]


MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def oversized(root: str) -> list[str]:
  """The modules of engine/, flags/, models/ and bench/ under `root` over
  MAX_MODULE_LINES, and their functions over MAX_FUNCTION_LINES: past
  those, two responsibilities share a room (../shared/STYLE.md)."""
  found = []
  for package in ("engine", "flags", "models", "bench"):
    for path in sorted(pathlib.Path(root, package).rglob("*.py")):
      source = path.read_text()
      name = str(path.relative_to(root))
      if source.count("\n") > MAX_MODULE_LINES:
        found.append(f"{name}: {source.count(chr(10))} lines")
      for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
          lines = node.end_lineno - node.lineno + 1
          if lines > MAX_FUNCTION_LINES:
            found.append(f"{name}: {node.name} {lines} lines")
  return found


def test_no_module_or_function_outgrows_its_room(tmp_path):
  assert oversized(fixtures.REPO) == []
  # The check finds both: a long module, and a long function in it.
  (tmp_path / "engine").mkdir()
  body = "".join(f"  x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
  (tmp_path / "engine" / "long.py").write_text(
      "def long():\n" + body + "\n" * MAX_MODULE_LINES)
  assert oversized(str(tmp_path)) == [
      f"engine/long.py: {MAX_MODULE_LINES + MAX_FUNCTION_LINES + 1} lines",
      f"engine/long.py: long {MAX_FUNCTION_LINES + 1} lines"]
