"""What runs on the devices: the fused embedding kernels (``kernels``), the exchange of
pooled embeddings (``exchange``), the dense part as torch modules (``dense``) and the
worker processes (``launch``).

The cost samples time this code and the runtime trains with it, so what is measured and what
trains are one code. Plans and the search never import it: the torch-free facts they share with
it (weights precisions, row caps, batch shares, the dense part's operators) live in
``constants``, ``validate`` and ``model_spec``.
"""
