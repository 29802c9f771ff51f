"""Repository tooling (not part of the devlab package): links, set-up cells, rendering, measuring."""
