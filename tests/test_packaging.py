"""pyproject.toml declares what the package imports, its extras do not install two
fbgemm builds, the wheel ships the licence files, and the version is the formats' version."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: import name -> distribution name, where they differ
DISTRIBUTION = {"sklearn": "scikit-learn", "fbgemm_gpu": "fbgemm-gpu-cpu", "yaml": "pyyaml"}
#: imported only where present (guarded), installed apart: see pyproject's comments
OPTIONAL = {"torchrec", "fbgemm_gpu"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def _imports() -> set[str]:
    found = set()
    for path in (ROOT / "neuroshard").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"neuroshard", "__future__"}


def test_every_import_is_declared():
    project = PYPROJECT["project"]
    declared = _names(project["dependencies"])
    extras = set().union(*(_names(v) for v in project["optional-dependencies"].values()))
    for name in _imports():
        dist = DISTRIBUTION.get(name, name).lower()
        assert dist in declared or (name in OPTIONAL and (dist in extras or name == "torchrec")), name


def test_extras_do_not_pull_two_fbgemm_builds_and_torch_is_bounded():
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    everything = set().union(*(_names(v) for v in extras.values()))
    assert "fbgemm-gpu" not in everything and "torchrec" not in everything  # torchrec requires fbgemm-gpu
    torch = [r for r in project["dependencies"] if _names([r]) == {"torch"}]
    assert torch and "<" in torch[0]


def test_licence_files_are_shipped():
    project = PYPROJECT["project"]
    for path in project["license-files"]:
        assert (ROOT / path).is_file(), path
    assert "neuroshard/data/dlrm_datasets_LICENSE" in project["license-files"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_the_version_is_the_formats_version_and_has_a_changelog_line():
    """docs/decisions.md#versioning: one version in pyproject.toml and the package, a 1.x while the v1
    formats hold, and a line for it in docs/formats.md's changelog."""
    version = PYPROJECT["project"]["version"]
    package = {}
    exec((ROOT / "neuroshard" / "version.py").read_text(), package)
    assert package["__version__"] == version
    assert re.fullmatch(r"1\.\d+\.\d+", version), version
    changelog = (ROOT / "docs" / "formats.md").read_text(encoding="utf-8").split("\n## Changelog\n", 1)
    assert len(changelog) == 2, "docs/formats.md has no '## Changelog' section"
    assert f"- **{version}** (" in changelog[1], f"docs/formats.md's changelog has no line for {version}"
