"""The suite's layout: test folders mirror the package (tests/ops/ for tracejit/ops/, ...;
tests/eager/ for DeZero's public modules at the top of tracejit/), and test files are
imported by their basenames (pytest's default import mode, no __init__.py in the
folders), so two test files of one name would collide: basenames are unique."""
import collections
import os

import tracejit

TESTS = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(os.path.abspath(tracejit.__file__))


def _test_dirs():
    for root, dirs, files in os.walk(TESTS):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        yield os.path.relpath(root, TESTS), files


def test_test_file_basenames_are_unique():
    seen = collections.defaultdict(list)
    for rel, files in _test_dirs():
        for f in files:
            if f.endswith(".py"):
                seen[f].append(rel)
    assert {f: dirs for f, dirs in seen.items() if len(dirs) > 1} == {}


def test_folders_mirror_the_package():
    for rel, files in _test_dirs():
        if rel in (".", "eager"):
            continue
        assert os.path.isdir(os.path.join(PACKAGE, rel)), f"tests/{rel} mirrors no package"
        assert "__init__.py" not in files, f"tests/{rel}/__init__.py changes the imports"


def test_eager_holds_the_top_level_modules_tests():
    eager = os.path.join(TESTS, "eager")
    assert os.path.isdir(eager) and not os.path.exists(os.path.join(eager, "__init__.py"))


def test_a_test_file_imports_suite_modules_from_its_folder_or_tests_only():
    # `pytest tests/x/test_a.py` alone puts tests/x/ and tests/ on sys.path, nothing
    # else: a module of another folder imports only when that folder was collected first.
    import ast
    where = {}
    for rel, files in _test_dirs():
        for f in files:
            if f.endswith(".py"):
                where[f[:-3]] = rel
    bad = []
    for rel, files in _test_dirs():
        for f in files:
            if not f.endswith(".py"):
                continue
            tree = ast.parse(open(os.path.join(TESTS, rel, f), encoding="utf-8").read())
            for node in ast.walk(tree):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                for name in names:
                    home = where.get(name.split(".")[0])
                    if home is not None and home not in (rel, "."):
                        bad.append(f"tests/{rel}/{f} imports {name} from tests/{home}")
    assert bad == []
