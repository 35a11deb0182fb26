"""LumoTree: pip-installable package (python/lumotree) + optional CUDA extension (csrc/).

Two compiled extensions, both optional (each has a Python / torch fallback) and skipped with
LUMOTREE_NO_EXTENSION=1: ``lumotree._C`` (CUDA: fused selection, the decode step's small kernels) when nvcc is
found (CUDA_HOME or PATH), and ``lumotree._host`` (C++: the suffix drafter) wherever torch is installed. Build with
``pip install --no-build-isolation`` so the installed torch is used. GPU architectures:
``TORCH_CUDA_ARCH_LIST`` when set (e.g. ``"9.0"`` for an H100/H200 only, faster to build), else
:data:`DEFAULT_ARCHS` -- A100 (sm_80), H100/H200 (sm_90), B200 (sm_100), RTX 50xx/RTX PRO (sm_120),
DGX Spark GB10 (sm_121) -- as far as the installed nvcc supports them, plus PTX of the newest.
"""
import glob
import os
import shutil
import subprocess

from setuptools import find_packages, setup

ext_modules, cmdclass = [], {}
if not os.environ.get("CUDA_HOME") and os.path.isdir("/usr/local/cuda/include"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"  # nvcc is on PATH but torch would guess its parent
DEFAULT_ARCHS = ("80", "90", "100", "120", "121")


def nvcc_arch_flags(nvcc: str = "nvcc", env=os.environ) -> list:
    """``-gencode`` flags for :data:`DEFAULT_ARCHS` that ``nvcc`` supports; ``[]`` when
    ``TORCH_CUDA_ARCH_LIST`` is set (torch's BuildExtension turns that into flags itself)."""
    if env.get("TORCH_CUDA_ARCH_LIST"):
        return []
    try:
        listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = []
    archs = [a for a in DEFAULT_ARCHS if f"compute_{a}" in listed] or ["90"]  # an nvcc without the listing
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    return flags + [f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"]


# the CUDA extension (fused selection, the step kernels): csrc/*.cc and csrc/<op>/*.cu, built when nvcc is present
sources = sorted(glob.glob("csrc/*/*.cu") + glob.glob("csrc/*.cc"))
# the host extension (the suffix drafter in C++, pybind11): csrc/host/*.cc, built wherever torch is
host_sources = sorted(glob.glob("csrc/host/*.cc"))
try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
except ImportError:  # torch not installed yet (build isolation): package only, Python / torch fallbacks
    BuildExtension = None
if BuildExtension is not None and not os.environ.get("LUMOTREE_NO_EXTENSION"):
    if sources and (os.environ.get("CUDA_HOME") or shutil.which("nvcc")):
        cuda_home = os.environ.get("CUDA_HOME")
        nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home and os.path.exists(
            os.path.join(cuda_home, "bin", "nvcc")) else "nvcc"
        ext_modules.append(CUDAExtension(
            name="lumotree._C",
            sources=sources,
            py_limited_api=True,
            extra_compile_args={
                "cxx": ["-O3"],
                "nvcc": ["-O3", *nvcc_arch_flags(nvcc)],
            },
        ))
    if host_sources:
        # optional=True: a failed compile of it is skipped by setuptools (then the Python drafter serves); a
        # machine without any C++ compiler may fail earlier in torch's checks: LUMOTREE_NO_EXTENSION=1
        ext_modules.append(CppExtension(name="lumotree._host", sources=host_sources, optional=True,
                                        extra_compile_args={"cxx": ["-O3", "-std=c++17", "-pthread"]},
                                        extra_link_args=["-pthread"]))
    if ext_modules:
        cmdclass["build_ext"] = BuildExtension

setup(
    name="lumotree",
    version="0.1.0",
    description="Tree speculative decoding for hybrid GDN/attention models, as an SGLang plugin",
    package_dir={"": "python"},
    packages=find_packages("python"),
    python_requires=">=3.11",
    install_requires=["torch==2.11.0", "sglang==0.5.17"],
    extras_require={"test": ["pytest", "pytest-xdist", "hypothesis"]},
    entry_points={
        "console_scripts": ["lumotree = lumotree.cli:main"],
        "sglang.srt.plugins": ["lumotree = lumotree.sglang.plugin:register"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
