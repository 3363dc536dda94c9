"""Builds hcomm and its extension ``hcomm._C`` with torch's cpp_extension + ninja.

Install into an environment that already has torch, without build isolation
(which would pull a second torch into a temporary environment):

    pip install --no-build-isolation -e .

CUDA sources (``csrc/**/*.cu``) are compiled when torch was built with CUDA
and nvcc is found (``CUDA_HOME`` or ``nvcc`` on PATH); otherwise the build is
CPU-only.  ``HCOMM_BUILD_CUDA=0`` forces a CPU build, ``=1`` makes a missing
toolkit an error.  ``TORCH_CUDA_ARCH_LIST`` overrides the default "8.0;9.0".
"""
import glob
import os
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def _want_cuda():
    import torch
    from torch.utils import cpp_extension

    flag = os.environ.get("HCOMM_BUILD_CUDA", "auto").lower()
    if flag in ("0", "false", "no", "off"):
        return False
    has_toolkit = cpp_extension.CUDA_HOME is not None and torch.version.cuda is not None
    if flag in ("1", "true", "yes", "on") and not has_toolkit:
        sys.exit("HCOMM_BUILD_CUDA=1 but torch has no CUDA or CUDA_HOME/nvcc was not found")
    return has_toolkit


LINK_ARGS = ["-lpthread", "-lrt"]  # rt: shm_open on glibc < 2.34


def _extension():
    from torch.utils import cpp_extension

    cpp = (_sources("csrc/core/**/*.cpp") + _sources("csrc/adapters/**/*.cpp")
           + _sources("csrc/torch/**/*.cpp") + _sources("python/*.cpp"))
    cuda = _want_cuda()
    # No -std flag: cpp_extension picks the one the installed torch needs
    # (C++17 for torch 2.11-2.13, C++20 for 2.14); the code builds under both.
    cxx_flags = ["-O3", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"]
    define_macros = []
    if cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
        define_macros.append(("HCOMM_WITH_CUDA", "1"))
        sources = cpp + _sources("csrc/**/*.cu")
        return cpp_extension.CUDAExtension(
            "hcomm._C", sources, include_dirs=[os.path.join(ROOT, "csrc"), ROOT],
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "--expt-relaxed-constexpr"]},
            extra_link_args=LINK_ARGS,
        )
    return cpp_extension.CppExtension(
        "hcomm._C", cpp, include_dirs=[os.path.join(ROOT, "csrc"), ROOT],
        define_macros=define_macros, extra_compile_args={"cxx": cxx_flags},
        extra_link_args=LINK_ARGS,
    )


def _build_ext():
    from torch.utils.cpp_extension import BuildExtension

    return BuildExtension.with_options(use_ninja=True)


setup(
    name="hcomm",
    version="0.1.0",
    description="Communication middleware and parallel training for heterogeneous GPU clusters",
    long_description=open(os.path.join(ROOT, "README.md")).read() if os.path.exists(os.path.join(ROOT, "README.md")) else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["hcomm", "hcomm.*"]),
    package_data={"hcomm": ["emulate/presets/*.yaml", "bench/*.json"]},
    install_requires=["pyyaml>=6", "numpy"],
    extras_require={"plot": ["matplotlib"], "test": ["pytest", "hypothesis"]},
    entry_points={"console_scripts": ["hcomm=hcomm.cli:main"]},
    ext_modules=[_extension()],
    cmdclass={"build_ext": _build_ext()},
    zip_safe=False,
)
