"""README's quick start is what CI runs, and every environment variable the code reads is documented (README's table
and ``lumotree.__init__``'s docstring)."""
import os
import re

import lumotree
from lumotree.sglang.plugin import REMOVED_ENV

ROOT = os.path.join(os.path.dirname(__file__), "..")
# names of the form LUMOTREE_* that are not environment variables a user could set
NOT_VARIABLES = {"LUMOTREE_ORACLE", "LUMOTREE_SUFFIX",  # speculative algorithms
                 "LUMOTREE_SGLANG_ACTIVE"}  # set by the plugin for its scheduler processes (documented in __init__)


def read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def test_readme_quick_start_runs_what_ci_runs():
    readme, ci = read("README.md"), read(".ci", "run")
    quick = readme[readme.index("## Quick start"):readme.index("\n## ", readme.index("## Quick start") + 1)]
    commands = [line.strip() for line in ci.splitlines() if "pip install" in line or "pytest" in line
                or line.strip().startswith("lumotree ")]
    assert commands and any(c.startswith("lumotree demo") for c in commands)
    shown = [line.split("  #")[0].strip().replace(" -q", "") for line in quick.splitlines() if line.startswith("    ")]
    for c in commands:
        assert any(c.replace(" -q", "") in line for line in shown), f"README's quick start lacks CI's command: {c}"


def variables_read():
    names = set()
    for top in ("python", "benchmark"):
        for root, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    with open(os.path.join(root, f)) as h:
                        names.update(re.findall(r"[\"'](LUMOTREE_[A-Z0-9_]+)[\"']", h.read()))
    return names - NOT_VARIABLES


def test_every_environment_variable_is_documented():
    names = variables_read()
    assert "LUMOTREE_OPS" in names and "LUMOTREE_BENCH_JIT_LOG" in names  # the scan finds them
    readme, doc = read("README.md"), lumotree.__doc__
    refused = set(REMOVED_ENV)  # an error at start-up that names what to do instead
    missing_readme = sorted(n for n in names - refused if f"`{n}" not in readme)
    missing_doc = sorted(n for n in names - refused if n not in doc)
    assert not missing_readme, f"README's environment table lacks {missing_readme}"
    assert not missing_doc, f"lumotree/__init__.py's docstring lacks {missing_doc}"


def test_readme_keeps_its_sections():
    """The sections a user reads README for (a results edit once dropped the install, serve, flags and quick-start
    sections and the coding-agent results without anyone noticing)."""
    readme = read("README.md")
    for heading in ("## Quick start", "## Is it faster?", "## Install", "## Serve", "### Flags", "## Limits",
                    "## Layout"):
        assert f"\n{heading}" in readme, f"README lost its section {heading!r}"
    for result in ("**Coding agents.**", "Environment variables", "Refused at start-up"):
        assert result in readme, f"README lost {result!r}"
