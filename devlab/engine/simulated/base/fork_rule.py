"""What a fork does to simulated GPUs: CUDA's rule.

A process that has initialized CUDA cannot use it in a child it forks: the child's first CUDA
call raises "Cannot re-initialize CUDA in forked subprocess" (torch/cuda/__init__.py,
`_lazy_init`, once C++ has marked the child a "bad fork"). A child forked before the parent
initialized CUDA may initialize it itself. Simulated GPUs follow that rule, which is what a
user of real CUDA expects (a DataLoader worker, or plain `multiprocessing` with fork, that
touches a GPU tensor fails the same way on the real machine), rather than hand the child the
values: the simulated runtime counts as initialized once a simulated tensor is made, or a
`torch.cuda` call that initializes CUDA ran (`initialize`). In a bad fork, `torch.cuda`'s
initializing calls, making a simulated tensor and using one (`_workers.wait`, which every use
passes) raise CUDA's error; `torch.cuda.is_initialized()` is False and
`torch.cuda._is_in_bad_fork()` True there. Metadata (`t.device`, `t.shape`), `is_available()`
and `device_count()` answer, as on CUDA.

Whatever the child may do, it never sees an unfinished product: a fork first waits for every
simulated GPU's queued work. devlab's own forked ranks (`devlab.launch`, which synchronizes
before it forks) are started as if spawned: `reset_for_rank()`. A child forked while GPUs are
simulated computes with one CPU thread (torch's OpenMP does not survive a fork).
"""

from __future__ import annotations

import os
import threading

import torch

from devlab.engine.simulated.base import cuda_errors as _errors
from devlab.engine.simulated.base import gpu_workers as _workers
from devlab.engine.simulated.base import session as _session

# The parent's `used` flag, which a bad fork clears so that its first new tensor comes to
# initialize() and fails (see _after_in_child); a rank gets it back.
_parent_used = False


def check() -> None:
    """CUDA's error if this process is a bad fork."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if _session.bad_fork:
        raise _errors.forked_after_init()


def initialize() -> None:
    """The simulated runtime's lazy initialization (torch.cuda._lazy_init's place): refused in
    a bad fork, else it marks this process's simulated GPUs initialized."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame
    if _session.bad_fork:
        raise _errors.forked_after_init()
    sess = _session.session
    if sess is not None:
        sess.initialized = True
        # Initialized: what the runtime sees is fixed (a caller past here may hold `sess`).
        _session.at_first_use = None


def is_in_bad_fork() -> bool:
    """torch.cuda._is_in_bad_fork for simulated GPUs."""
    return _session.bad_fork


def reset_for_rank() -> None:
    """Make a forked child one that may use the simulated GPUs it inherited, as a spawned
    process would (devlab's forked ranks: their parent finished its queued work first)."""
    sess = _session.session
    if _session.bad_fork and sess is not None:
        sess.used = _parent_used
    _session.bad_fork = False
    _workers.set_alert()


def _before() -> None:
    # Every queued product finished before the child copies memory. Errors stay queued for
    # the parent's next sync; a fork cannot raise.
    try:
        _workers.drain()
    except BaseException:  # noqa: S110 - an interrupt here must not stop the fork
        pass


def _after_in_child() -> None:
    global _parent_used
    # The parent's threads are gone; a lock one of them held would never be released.
    _session.lock = threading.RLock()
    sess = _session.session
    if sess is not None:
        # GNU OpenMP (a CPU build of torch's, which computes every simulated op) does not survive
        # a fork once the parent has used its threads: the child's first parallel op waits for
        # ever on threads it does not have (measured: 20 of 20 forked children hung after a
        # 1000x1000 product in the parent). One thread each, as DataLoader's forked workers and
        # torchrun's ranks (OMP_NUM_THREADS=1) take; a child needing more spawns.
        torch.set_num_threads(1)
    if sess is not None:
        for dev in sess.devices:  # the parent's queued ops, if any raced the fork, are not here
            dev.queued.clear()
    if sess is not None and sess.initialized and not _session.bad_fork:
        _session.bad_fork = True
        _parent_used = sess.used
        sess.used = False  # so that the first tensor made here calls initialize()
    _workers.forget_in_child()


os.register_at_fork(before=_before, after_in_child=_after_in_child)
