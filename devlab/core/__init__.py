"""The core the fronts rest on: device names, config, placement, the placement log, memory readers, timing, ranks."""
