"""Build specops: setup.py drives CMake (ninja) to compile specops._C.

Where the installed torch has CUDA, the CUDA kernels are compiled too
(architectures from SPECOPS_CUDA_ARCHS, default "90" for the H200/H100);
where it has none, only the CPU implementations are built. Set
SPECOPS_FORCE_CPU=1 to build the CPU-only extension on a CUDA machine.

The source folders triton_kernels/ and pyengine/ are installed as
specops.triton_kernels and specops.engine. Besides specops, one small top-level module is
installed: _specops_main, the `specops` console script (it must import nothing heavy).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str, source_dir: Path):
        super().__init__(name, sources=[])
        self.source_dir = str(source_dir)


class CMakeBuild(build_ext):
    def build_extension(self, ext: CMakeExtension) -> None:
        import torch  # the torch we compile against: installed beforehand (--no-build-isolation)

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / ext.name
        build_dir.mkdir(parents=True, exist_ok=True)
        with_cuda = torch.version.cuda is not None and os.environ.get("SPECOPS_FORCE_CPU", "0") != "1"
        cfg = os.environ.get("SPECOPS_BUILD_TYPE", "Release")
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DSPECOPS_EXT_NAME={ext.name.split('.')[-1]}",
            f"-DSPECOPS_WITH_CUDA={'ON' if with_cuda else 'OFF'}",
            f"-DSPECOPS_CUDA_ARCHS={os.environ.get('SPECOPS_CUDA_ARCHS', '90')}",
            "-GNinja",
        ]
        if with_cuda:
            nvcc = _find_nvcc()
            if nvcc:  # else CMake searches PATH itself, and fails with a clear message
                root = Path(nvcc).resolve().parent.parent
                args += [f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DCUDAToolkit_ROOT={root}", f"-DCUDA_TOOLKIT_ROOT_DIR={root}"]
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.run(["cmake", ext.source_dir, *args], cwd=build_dir, check=True)
        subprocess.run(["cmake", "--build", ".", "-j", jobs], cwd=build_dir, check=True)


def _find_nvcc() -> str | None:
    """nvcc from CUDACXX, CUDA_HOME/CUDA_PATH, PATH, or /usr/local/cuda, in that order."""
    candidates = [os.environ.get("CUDACXX")]
    candidates += [str(Path(os.environ[k]) / "bin" / "nvcc") for k in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(k)]
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def packages() -> tuple[list[str], dict[str, str]]:
    """specops from specops/, specops.triton_kernels from triton_kernels/, specops.engine from pyengine/."""
    names = ["specops"] + [f"specops.{p}" for p in find_packages("specops")]
    package_dir = {"specops": "specops"}
    for src, dst in (("triton_kernels", "specops.triton_kernels"), ("pyengine", "specops.engine")):
        package_dir[dst] = src
        names.append(dst)
        names += [f"{dst}.{p}" for p in find_packages(src)]
    return names, package_dir


names, package_dir = packages()
setup(
    packages=names,
    package_dir=package_dir,
    py_modules=["_specops_main"],   # the console script (catches a Ctrl-C while specops imports)
    ext_modules=[CMakeExtension("specops._C", ROOT)],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
