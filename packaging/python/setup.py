# What pyproject.toml cannot say: the version (the CMake project's, from scripts/wheel) and the
# wheel's tag. The wheel holds native programs but no extension module, so it is tagged
# py3-none-<platform>: any CPython 3 may install it, on a platform whose glibc runs the binaries
# (manylinux_2_34: they need glibc 2.34 at most, tests/launcher/self_contained_test.sh).
import os
import sys

from setuptools import setup
from setuptools.dist import Distribution
from wheel.bdist_wheel import bdist_wheel


def _required(name):
    value = os.environ.get(name, "")
    if not value:
        sys.exit(f"setup.py: {name} is not set: build the wheel with scripts/wheel")
    return value


class _ProgramsDistribution(Distribution):
    # Platform-specific (the binaries are x86_64 or aarch64 ELF files): the package goes to
    # platlib, at the wheel's root (Root-Is-Purelib: false), as a package with native code does.
    def has_ext_modules(self):
        return True


class _ProgramsWheel(bdist_wheel):
    def get_tag(self):
        return "py3", "none", _required("DDPRUN_WHEEL_PLATFORM")


setup(
    version=_required("DDPRUN_VERSION"),
    distclass=_ProgramsDistribution,
    cmdclass={"bdist_wheel": _ProgramsWheel},
)
