"""The import contract (.importlinter, checked by import-linter): stages import downward.

core <- functions/ops <- DeZero's higher-level modules <- ir <- passes <- trace | backends
<- runtime | autodiff <- testing | demo. A later change that imports upward fails here.
"""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or \
    shutil.which("lint-imports")



def _lint(config):
    assert LINT is not None, "import-linter is a test dependency: pip install -e '.[test]'"
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([LINT, "--config", config, "--no-cache"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_stages_import_downward_only():
    r = _lint(os.path.join(ROOT, ".importlinter"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 kept, 0 broken" in r.stdout


def test_the_contract_catches_an_upward_import(tmp_path):
    # The same contract with passes and ir swapped: passes import ir, so it must break.
    # (A checker that saw no imports would pass both tests otherwise.)
    text = open(os.path.join(ROOT, ".importlinter"), encoding="utf-8").read()
    swapped = text.replace("    tracejit.passes\n    tracejit.ir\n",
                           "    tracejit.ir\n    tracejit.passes\n")
    assert swapped != text
    config = tmp_path / "swapped.ini"
    config.write_text(swapped, encoding="utf-8")
    r = _lint(str(config))
    assert r.returncode != 0
    assert "tracejit.passes" in r.stdout and "tracejit.ir" in r.stdout
