"""`python -m devlab` and the `devlab` command: `devlab.fronts.command_line`."""

from devlab.fronts.command_line import main

if __name__ == "__main__":
    main()
