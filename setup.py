"""Everything is in pyproject.toml, except installing `ndd_trace.pth` into site-packages.

Python runs the .pth line at start-up; it imports the NDD_TRACE=1 hook only when NDD_TRACE is set.
Data files cannot do it: they land under the prefix, and editable installs skip them.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "ndd_trace.pth"


class BuildPyWithPth(build_py):
    """Puts ndd_trace.pth at the root of the wheel: regular wheels are built from build_lib;
    editable ones (`pip install -e .`) from the install command's directory, the wheel itself."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        self.mkpath(target)
        self.copy_file(PTH, os.path.join(target, PTH), preserve_mode=False)


setup(cmdclass={"build_py": BuildPyWithPth})
