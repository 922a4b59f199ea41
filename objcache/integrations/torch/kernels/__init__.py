"""CPU kernel artifacts (docs/torch.md): ``kernels`` stores compiled C++ kernels and
precompiled headers content-addressed, ``kernel_places`` puts prefetched binaries where torch
looks, ``artifact_kernels`` derives the kernels a set of Mega-Cache graphs needs."""
