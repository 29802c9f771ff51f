# The sample projects run in their own pytest sessions (tests/test_pytest_plugin.py), never
# as part of devlab's suite.
collect_ignore_glob = ["*"]
