"""The TorchFunctionMode that places every torch call (`routing`), the device rule and the call
(`ops`, `dispatched`), its per-op handlers (factories, moves, autograd, asynchronous launch), and
the patches of torch's own device queries and Tensor properties that the mode relies on.
Imports `core` and `clock`."""
