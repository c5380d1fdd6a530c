"""The Pallas kernels, one module a kernel family, and the one module that decides which form of
each operation runs (:mod:`alodlm_jax.kernels.select`, with its table of the kernels' conditions).

* :mod:`~alodlm_jax.kernels.window`: a window's attention over the cache, read in place (a
  Mosaic kernel for TPUs, a Triton one for NVIDIA GPUs);
* :mod:`~alodlm_jax.kernels.head_norm`: the heads' norms and RoPE (Triton);
* :mod:`~alodlm_jax.kernels.matmul`: a window layer's products with their norms and residual
  adds (Triton);
* :mod:`~alodlm_jax.kernels.common`: what they share (tiles; the heads' norm and RoPE as a
  kernel computes them).

The network (:mod:`alodlm_jax.network`) calls them only through the forms
:mod:`~alodlm_jax.kernels.select` allows.
"""
