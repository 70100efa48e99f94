"""The README's install commands name only what exists: the pinned torch and in-repo packages."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hyper_core.config import read_toml

ROOT = Path(__file__).resolve().parents[2]


def pip_install_args() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    args = []
    for line in "\n".join(blocks).splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] == ["pip", "install"]:
            args += [w for w in words[2:] if not w.startswith("-")]
    return args


def test_readme_installs_only_the_pinned_torch_and_packages_of_this_repository() -> None:
    args = pip_install_args()
    assert "torch==2.13.0" in args
    packages = [a for a in args if not a.startswith("torch==")]
    assert packages, "the README shows no install of hyper-train"
    names = set()
    for arg in packages:
        pyproject = ROOT / arg / "pyproject.toml"
        assert pyproject.is_file(), f"README: `pip install {arg}` is not a package of this repo"
        names.add(read_toml(pyproject)["project"]["name"])
    assert {"hyper-train", "hyper-train-qwen-vl"} <= names
