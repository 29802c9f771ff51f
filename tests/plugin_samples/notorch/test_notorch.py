"""Unasked, the plugin imports nothing: a project without torch pays nothing for it."""

import sys


def test_nothing_imported():
    assert "torch" not in sys.modules
    assert "devlab" not in sys.modules
