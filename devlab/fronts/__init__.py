"""What a person uses: the notebook lab, the pytest plugin, the command line."""
