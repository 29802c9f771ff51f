"""Lightning's own test helper, as its repository writes it (tests/tests_pytorch/helpers/runif.py,
Apache-2.0, Lightning AI): `RunIf(min_cuda_gpus=N)` is a skipif over
`lightning.pytorch.utilities.testing._runif_reasons`, which the package exports."""

import pytest
from lightning.pytorch.utilities.testing import _runif_reasons


def RunIf(**kwargs):  # noqa: N802 (Lightning's name)
    reasons, marker_kwargs = _runif_reasons(**kwargs)
    return pytest.mark.skipif(condition=len(reasons) > 0,
                              reason=f"Requires: [{' + '.join(reasons)}]", **marker_kwargs)
