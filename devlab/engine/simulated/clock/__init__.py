"""Time on a modeled GPU: the simulation's side of `devlab.gpu_model` (its specifications, what
an op is to the model, the modeled clock, `explain`). Imports only `core`."""
