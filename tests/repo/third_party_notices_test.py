"""The licence files are there, and THIRD_PARTY_NOTICES.md has an entry for every package
that tools/setup and the images install (tools/make-third-party-notices --check): a
package added to tools/setup or a Dockerfile without one fails here."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "make-third-party-notices")
# What the tool reads, relative to the root.
INPUTS = ["tools/setup", "tools/third-party-licences.tsv", "THIRD_PARTY_NOTICES.md"] + [
    os.path.relpath(p, ROOT) for pattern in ("deploy/tools/install-*", "deploy/docker/Dockerfile*")
    for p in glob.glob(os.path.join(ROOT, pattern))]


def run_tool(root, *args):
    return subprocess.run([sys.executable, TOOL, "--root", str(root), *args], capture_output=True, text=True)


def copy_of_inputs(tmp_path, path=None, old=None, new=None):
    """A tree holding this checkout's copies of the tool's inputs, with `old` replaced by
    `new` in `path`."""
    for rel in INPUTS:
        os.makedirs(tmp_path / os.path.dirname(rel), exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), tmp_path / rel)
    if path is not None:
        text = (tmp_path / path).read_text(encoding="utf-8")
        assert old in text, f"{path} no longer has {old!r}: update this test"
        (tmp_path / path).write_text(text.replace(old, new, 1), encoding="utf-8")
    return tmp_path


def test_licence_is_apache_2_0_and_notice_points_at_the_lists():
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
        licence = f.read()
    assert licence.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in licence
    assert "END OF TERMS AND CONDITIONS" in licence
    with open(os.path.join(ROOT, "NOTICE"), encoding="utf-8") as f:
        notice = f.read()
    assert "Apache License, Version 2.0" in notice
    assert "THIRD_PARTY_NOTICES.md" in notice


def test_notice_has_an_entry_for_every_installed_package():
    p = run_tool(ROOT, "--check")
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("path, old, new, problem", [
    ("tools/setup", " nftables\n", " nftables libfoo-dev\n",
     "missing: debian package libfoo-dev (installed by tools/setup DEBIAN_PACKAGES)"),
    ("tools/setup", "PYTHON_PACKAGES=(numpy ", "PYTHON_PACKAGES=(numpy new-package==1.0 ",
     "missing: pypi package new-package (installed by tools/setup PYTHON_PACKAGES)"),
    ("tools/setup", "REFERENCE_PACKAGES=(torch ", "REFERENCE_PACKAGES=(torch vllm ",
     "missing: pypi package vllm (installed by tools/setup REFERENCE_PACKAGES)"),
    ("tools/setup", "REFERENCE_PACKAGES=(", "DATA_ONLY_PYTHON_PACKAGES=(llm-foo)\nREFERENCE_PACKAGES=(",
     "missing: pypi package llm-foo (installed by tools/setup DATA_ONLY_PYTHON_PACKAGES)"),
    ("tools/setup", "tokenizers==0.23.3", "tokenizers==0.24.0",
     "version: pypi package tokenizers is pinned to 0.24.0, the notice says 0.23.3"),
    ("deploy/docker/Dockerfile", "ca-certificates sudo", "ca-certificates sudo curl",
     "missing: debian package curl (installed by deploy/docker/Dockerfile)"),
    ("deploy/docker/Dockerfile", "WORKDIR /src\n", "WORKDIR /src\nRUN python3 -m pip install -q uvloop==0.21.0\n",
     "missing: pypi package uvloop (installed by deploy/docker/Dockerfile)"),
    ("deploy/docker/Dockerfile.cuda", "FROM debian:12 AS build", "FROM ubuntu:24.04 AS build",
     "missing: image package ubuntu (installed by deploy/docker/Dockerfile.cuda)"),
    ("deploy/tools/install-checkov", "\"checkov==$VERSION\"", "\"checkov==$VERSION\" bandit",
     "missing: pypi package bandit (installed by deploy/tools/install-checkov)"),
    ("tools/setup", " nftables\n", "\n", "stale: debian package nftables is listed but nothing installs it"),
])
def test_check_reports_a_package_without_an_entry(tmp_path, path, old, new, problem):
    p = run_tool(copy_of_inputs(tmp_path, path, old, new), "--check")
    assert p.returncode == 1, p.stderr
    assert problem in p.stderr


def test_generator_finds_a_licence_for_every_package(tmp_path):
    root = copy_of_inputs(tmp_path)
    os.remove(root / "THIRD_PARTY_NOTICES.md")
    p = run_tool(root)
    assert p.returncode == 0, p.stderr
    assert run_tool(root, "--check").returncode == 0
    rows = [line.split(" | ") for line in (root / "THIRD_PARTY_NOTICES.md").read_text().splitlines()
            if line.startswith("| `")]
    assert len(rows) > 50
    assert all(row[2].strip() for row in rows), "a row without a licence"
