"""The suite's own runner: tests marked `xdist_group` share one worker under `--dist loadgroup`
(scripts/test.sh), which is what runs each corpus program once for all its tests and builds
each expensive fixture once. pytest-xdist says so by suffixing the test's id with the group;
pytest 9 ignores that suffix and every worker would run the program again."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("suite-groups")
def test_a_marked_test_is_grouped_under_loadgroup(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@suite-groups"), request.node.nodeid
