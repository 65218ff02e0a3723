"""Expert parallelism: routed experts split across the ranks of a torch.distributed group.

Attention is data-parallel: every rank serves its own requests with its own KV cache and a full
copy of the attention, dense-MLP and shared-expert weights; only the routed experts are split
(:mod:`.placement`). Each MoE layer exchanges tokens with the experts' owners through
:class:`.exchange.ExpertExchange`, whose collectives have fixed shapes (a padded capacity per
destination and a world x world counts matrix moved as tensors, prefix sums on the device), so a
decode step never synchronizes with the host and can be captured in a CUDA graph.

Every MoE layer is a collective, so ranks step in lockstep (:class:`.expert_parallel.ExpertParallel`
agrees on each step over a CPU gloo group): a rank whose requests are done runs idle steps that
serve its experts to the others. Results do not depend on the world size: each token's top-k
expert outputs are summed back on its owner in a fixed (k) order.

gloo on CPU, NCCL on GPU (:mod:`.distributed`).
"""
