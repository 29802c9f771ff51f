"""The simulation's state and the mechanisms every layer above uses: the running session and
its GPUs, which GPU a tensor lives on and the byte accounting (`marks`), the workers' queues,
CUDA's fork rule, the reader of device arguments, errors in torch's words, the undo log, and the
check of torch's internals. Imports nothing else of the simulation."""
