"""LumoTree: pip-installable package (python/lumotree) + optional CUDA extension (csrc/).

The extension is built when nvcc is found (CUDA_HOME or PATH) and LUMOTREE_NO_EXTENSION is unset;
build with ``pip install --no-build-isolation`` so the installed torch is used.
"""
import glob
import os
import shutil

from setuptools import find_packages, setup

ext_modules, cmdclass = [], {}
if not os.environ.get("CUDA_HOME") and os.path.isdir("/usr/local/cuda/include"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"  # nvcc is on PATH but torch would guess its parent
sources = sorted(glob.glob("csrc/**/*.cu", recursive=True) + glob.glob("csrc/**/*.cc", recursive=True))
if sources and not os.environ.get("LUMOTREE_NO_EXTENSION") and (
        os.environ.get("CUDA_HOME") or shutil.which("nvcc")):
    try:
        from torch.utils.cpp_extension import BuildExtension, CUDAExtension
    except ImportError:  # torch not installed yet (build isolation): package only, CPU fallbacks
        CUDAExtension = None
    if CUDAExtension is not None:
        ext_modules.append(CUDAExtension(
            name="lumotree._C",
            sources=sources,
            py_limited_api=True,
            extra_compile_args={
                "cxx": ["-O3"],
                "nvcc": ["-O3", "-gencode=arch=compute_90,code=sm_90"],
            },
        ))
        cmdclass["build_ext"] = BuildExtension

setup(
    name="lumotree",
    version="0.1.0",
    description="Tree speculative decoding for hybrid GDN/attention models, as an SGLang plugin",
    package_dir={"": "python"},
    packages=find_packages("python"),
    python_requires=">=3.11",
    install_requires=["torch==2.11.0", "sglang==0.5.17"],
    extras_require={"test": ["pytest", "hypothesis"]},
    entry_points={
        "console_scripts": ["lumotree = lumotree.cli:main"],
        "sglang.srt.plugins": ["lumotree = lumotree.sglang.plugin:register"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if ext_modules else {},
)
