"""The cost pipeline: stages, each written once, that the cost models compose.

1. :mod:`~.table`: the graph as columns (kept with the graph), and what later stages derive from the graph and a
   precision alone (kept with them);
2. :mod:`~.roofline`: each operator's bound on the GPU, and the unit its arithmetic runs on;
3. :mod:`~.kernel_times`: each operator's kernel timed by the learned operator model, never below its roofline;
4. :mod:`~.host_queue`: what the host adds before each operator, and the latency of the queue;
5. :mod:`~.memory` (with :mod:`~.allocator`): what the process holds;
6. :mod:`~.power`: joules from the latency, the busy time and the power the GPU draws;
7. :mod:`~.summary`: all of them into one :class:`~dippm_nas.cost.estimate.Estimate`, with the notes
   (:mod:`~.notes`) of what was priced.
"""
