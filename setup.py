"""Builds deepinfer._core through the project's CMake build (see pyproject.toml).

Environment: DEEPINFER_ACCELERATOR (cpu | nvidia | auto, as ./build.sh), DEEPINFER_JOBS (parallel jobs),
DEEPINFER_PIP_BUILD_DIR (CMake build directory, default build-pip in the checkout: incremental rebuilds, and at
the depth of build/ so ccache (base_dir) shares objects with ./build.sh),
DEEPINFER_CMAKE_ARGS (extra CMake arguments).
"""

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = pathlib.Path(os.environ.get("DEEPINFER_PIP_BUILD_DIR", ROOT / "build-pip")).resolve()
        acc = os.environ.get("DEEPINFER_ACCELERATOR", "auto")
        if acc == "ascend":
            sys.exit("DEEPINFER_ACCELERATOR=ascend: Ascend is not supported by this build (supported: cpu, nvidia)")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        cfg = ["cmake", "-S", str(ROOT), "-B", str(build_dir), *generator, "-DCMAKE_BUILD_TYPE=Release",
               f"-DDEEPINFER_ACCELERATOR={acc}", "-DDEEPINFER_BUILD_TESTS=OFF", "-DDEEPINFER_PYTHON=ON",
               f"-DPython_EXECUTABLE={sys.executable}", *shlex.split(os.environ.get("DEEPINFER_CMAKE_ARGS", ""))]
        subprocess.run(cfg, check=True)
        jobs = os.environ.get("DEEPINFER_JOBS", str(os.cpu_count() or 2))
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "deepinfer_python", "-j", jobs], check=True)
        built = sorted((build_dir / "python" / "deepinfer").glob("_core*.so"))
        if not built:
            sys.exit(f"the CMake build did not produce {build_dir}/python/deepinfer/_core*.so")
        dest = pathlib.Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], dest)


setup(ext_modules=[Extension("deepinfer._core", sources=[])], cmdclass={"build_ext": CMakeBuild})
