"""The CUDA kernels, in one place: the sources and everything from nvcc to a launch.

    selective.cu       the selective-scoring kernels (package data)
    nvcc.py            ahead-of-time compilation with nvcc: architectures, the toolkit, its process group
    cache.py           the per-user cache of nvcc's output; the kernel files a build ships
    compile.py         the sources and their entry points, compiled per architecture
    launch.py          the launch geometry and operand checks (pure functions)
    selective.py       the CuPy loader (NVRTC or a bundle's cubin/PTX) and the `selective_cuda` scoring mode
    bundle_kernels.py  a bundle's compiled kernels, checked and loaded for a device

The build side (nvcc, cache) is torch-free and GPU-free; the bundle's kernel file format is
bundle/kernel_files.py. CuPy is imported only when kernels are loaded, never at module load.
"""
