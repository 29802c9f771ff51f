"""The caching allocator's old import path, kept so that `devlab.gpu_model.allocator` (named
in notebooks, docs and users' code before issue 36) still imports: the model lives in
`devlab.gpu_model.caching_allocator`, split as torch splits it. Import from there."""

from __future__ import annotations

from .caching_allocator import *  # noqa: F403
from .caching_allocator import __all__  # noqa: F401
