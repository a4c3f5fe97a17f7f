"""The learned parts of the cost models: the operator network and the kernels' structure it reads, PMGNS's
network, the features both read, the one card format their weights carry, and the shipped weights."""
