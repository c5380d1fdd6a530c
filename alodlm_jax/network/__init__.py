"""The ALoDLM network as pure functions over the params pytree, and its KV cache.

* :mod:`~alodlm_jax.network.model`: the looped forward (prelude, core passes, coda readout,
  exit gate) and whole-sequence conveniences; its docstring states the numerics;
* :mod:`~alodlm_jax.network.layers`: a decoder layer's building blocks;
* :mod:`~alodlm_jax.network.window_layers`: the window forwards the decode loop runs (one
  request, or several requests' rows packed together);
* :mod:`~alodlm_jax.network.attention`: attention's XLA forms;
* :mod:`~alodlm_jax.network.cache`: the KV cache and the writes into it;
* :mod:`~alodlm_jax.network.rows`: the batch step's packed rows and lanes, and the shape
  policies;
* :mod:`~alodlm_jax.network.params`: loading the weights; :mod:`~alodlm_jax.network.sharding`:
  placing them and the cache on a mesh.

Which form of an operation runs on which platform (XLA's or a Pallas kernel's) is decided in
one place, :mod:`alodlm_jax.kernels.select`.
"""
