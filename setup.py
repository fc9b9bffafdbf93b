"""Build hook: ship the Ansible content (roles/, playbooks/, ansible.cfg) inside the package.

The content lives at the top of the source tree, where Ansible users expect it; a wheel carries a copy
as provisioner/content/, which provisioner.content finds first.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CONTENT = ("roles", "playbooks", "ansible.cfg")


class BuildWithContent(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the source tree
        target = Path(self.build_lib) / "provisioner" / "content"
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".cache", ".molecule")
        for name in CONTENT:
            src = HERE / name
            if src.is_dir():
                shutil.copytree(src, target / name, ignore=ignore, dirs_exist_ok=True)
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target / name)


setup(cmdclass={"build_py": BuildWithContent})
