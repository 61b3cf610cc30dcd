"""README.md and docs/: every link and every repository path they name exists.

The docs name files all the time (`flags/fashion_mnist_fast.cfg`,
`engine/compute/step.py`, `[faults](checkpoints-and-faults.md#faults)`), and files
move: a recipe renamed, a module split. These tests read the Markdown as
text, without TensorFlow, and list every name that no longer points at
anything, with the page and line that names it.
"""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 150


def _pages():
  return [os.path.join(ROOT, "README.md")] + sorted(
      glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _rel(path):
  return os.path.relpath(path, ROOT)


def _lines(path):
  with open(path, encoding="utf-8") as f:
    return f.read().splitlines()


# [text](target) and ![alt](target); the target ends at whitespace or ")",
# an optional "title" after it is ignored.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")   # http:, https:, mailto:


def _links(path):
  """(line number, target) for every Markdown link, code spans excluded."""
  for number, line in enumerate(_lines(path), 1):
    for match in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
      yield number, match.group(1)


def _slug(heading):
  """GitHub's anchor for a heading: markup dropped, lower case, punctuation
  other than "-" and "_" removed, each space a "-"."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # links: text
  text = re.sub(r"[`*]", "", text)
  text = re.sub(r"<[^>]+>", "", text)
  text = re.sub(r"[^\w\- ]", "", text.strip().lower())
  return text.replace(" ", "-")


def _anchors(path):
  """Every heading's anchor in a Markdown file, duplicates numbered -1, -2
  as GitHub numbers them. Headings inside fenced code are not headings."""
  anchors, seen, fenced = set(), {}, False
  for line in _lines(path):
    if re.match(r"^\s*(```|~~~)", line):
      fenced = not fenced
      continue
    match = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
    if match:
      slug = _slug(match.group(1))
      count = seen.get(slug, 0)
      anchors.add(slug if count == 0 else f"{slug}-{count}")
      seen[slug] = count + 1
  return anchors


def _broken_links(path):
  broken = []
  for number, target in _links(path):
    if _EXTERNAL.match(target):
      continue
    file_part, _, anchor = target.partition("#")
    where = f"{_rel(path)}:{number}: [..]({target})"
    resolved = (os.path.normpath(os.path.join(os.path.dirname(path),
                                              file_part))
                if file_part else path)
    if not os.path.exists(resolved):
      broken.append(f"{where}: {_rel(resolved)} does not exist")
    elif anchor and resolved.endswith(".md") and (
        anchor.lower() not in _anchors(resolved)):
      broken.append(f"{where}: no heading #{anchor} in {_rel(resolved)}")
  return broken


# A repository path written in the text: one of these top-level directories
# at the start of a word (not after another path component, a slash, a dot
# or a word character: model_dir/flags.txt, /usr/share/..., ../flags/x.cfg
# are not it), then path characters, ending in one of these extensions.
_PREFIXES = ("engine", "models", "flags", "bench", "docs", "examples",
             "scripts", "tests")
_EXTENSIONS = ("py", "cfg", "md", "sh", "sbatch", "png", "txt")
_PATH = re.compile(r"(?<![\w./\-])((?:%s)/[\w./\-]*\.(?:%s))(?![\w\-])" % (
    "|".join(_PREFIXES), "|".join(_EXTENSIONS)))
# A module run with -m: `python -m engine.train`, `-m bench.time_to_accuracy`.
_MODULE = re.compile(r"-m\s+((?:engine|bench)(?:\.\w+)+)")


def _named_paths(path):
  """(line number, repository path) for every path the page names."""
  for number, line in enumerate(_lines(path), 1):
    for match in _PATH.finditer(line):
      yield number, match.group(1)
    for match in _MODULE.finditer(line):
      module = match.group(1).replace(".", "/")
      yield number, (module + "/__init__.py"
                     if os.path.isdir(os.path.join(ROOT, module))
                     else module + ".py")


def _missing_paths(path):
  return [f"{_rel(path)}:{number}: {named} does not exist"
          for number, named in _named_paths(path)
          if not os.path.exists(os.path.join(ROOT, named))]


def test_the_pages_exist():
  names = [_rel(page) for page in _pages()]
  assert "README.md" in names and len(names) > 1, names


@pytest.mark.parametrize("page", _pages(), ids=_rel)
def test_every_relative_link_points_at_a_file_and_heading(page):
  broken = _broken_links(page)
  assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", _pages(), ids=_rel)
def test_every_repository_path_named_exists(page):
  missing = _missing_paths(page)
  assert not missing, "missing paths:\n" + "\n".join(missing)


def test_readme_is_at_most_150_lines():
  lines = len(_lines(os.path.join(ROOT, "README.md")))
  assert lines <= README_MAX_LINES, (
      f"README.md has {lines} lines, more than {README_MAX_LINES}: it is the "
      "front door; move the depth to a page in docs/ and index it there")


# The checks themselves, on pages written for them: a test that cannot fail
# proves nothing.


def test_a_broken_link_and_a_missing_path_are_reported(tmp_path):
  page = tmp_path / "page.md"
  page.write_text(
      "# A page\n\n## Second heading, with `code`\n"
      "[ok](page.md) [ok](#a-page) [ok](#second-heading-with-code)\n"
      "[web](https://example.com/x.md) [mail](mailto:a@b.c)\n"
      "[gone](missing.md) [no heading](page.md#nowhere)\n"
      "See `flags/fashion_mnist_fast.cfg` and flags/no_such_recipe.cfg;\n"
      "not repo paths: model_dir/flags.txt, /usr/share/docs/x.txt,\n"
      "runs/flags/a.cfg, ../flags/a.cfg, flags/<recipe>.cfg, flags/*.cfg.\n"
      "```sh\npython -m engine.no_such_module\n```\n")
  broken = _broken_links(str(page))
  assert len(broken) == 2, broken
  assert "missing.md does not exist" in broken[0]
  assert "no heading #nowhere" in broken[1]
  missing = _missing_paths(str(page))
  assert [m.split(": ", 1)[1] for m in missing] == [
      "flags/no_such_recipe.cfg does not exist",
      "engine/no_such_module.py does not exist"], missing
  assert [m.split(": ", 1)[0].rsplit(":", 1)[1] for m in missing] == [
      "7", "11"], missing


def test_github_slugs():
  assert _slug("Learning rate, optimizers, stopping") == (
      "learning-rate-optimizers-stopping")
  assert _slug("Against Keras `fit` and a plain loop") == (
      "against-keras-fit-and-a-plain-loop")
  assert _slug("CPU kernels: oneDNN") == "cpu-kernels-onednn"
  assert _slug("Time to accuracy: the engine's recipe") == (
      "time-to-accuracy-the-engines-recipe")
