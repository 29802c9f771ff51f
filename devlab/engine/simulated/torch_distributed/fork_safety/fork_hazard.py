"""The hazard the fork safety mechanisms are built around, how to tell it is present, and the
child's wait that avoids it.

`torch.multiprocessing.start_processes(start_method="fork")` is how torch elastic's agent
(accelerate's `notebook_launcher`) and Lightning's `ddp_notebook` start their ranks. It forks one
child after another from a process that has threads, and each child starts at once: rank 0
connects to the agent's TCPStore while the parent forks rank 1. The store's server thread names
each peer with `getnameinfo` (c10d's `formatSockAddr`, which asks for a host name: only
`NI_NUMERICSERV`), and glibc's resolver takes one process-wide lock there (`resolv_conf.c`'s
`lock`, in `__resolv_conf_get_current`, from `__resolv_context_get`). glibc's `fork` resets its
malloc, stdio, NSS and loader locks in the child, not that one (posix/fork.c as of glibc 2.34;
this machine's is 2.36), so a child forked while the server thread held it never gets past its
own `getnameinfo`, the one its TCPStore client makes on connecting (the hang of issue 29).
c10d's socket.cpp makes that call on every connect and accept, with no switch to make it
numeric (it stops only after a lookup fails), so the children cannot be kept from it.

What avoids it: no child runs until its parent has stopped forking (`wait_for_parent`), so no
thread of the parent resolves a child's name while the parent forks. The hazard is present
where a c10d store server thread runs (`store_thread_running`).
"""

from __future__ import annotations

import os
import select
import time

# A child goes on after this long without the parent's word (a parent stuck in its fork loop):
# the watchdog still reports it if it then hangs.
BARRIER_WAIT = 120.0
# A process holds a c10d store server while one of these threads runs (torch names them:
# `pt_tcpstore_uv`, libuv's server, the default; `pt_tcpstore`, the older one; torch 2.13).
STORE_THREAD = b"pt_tcpstore"


def store_thread_running() -> bool:
    """Whether a c10d store server thread runs in this process (Linux's /proc names them)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return False
    if len(tids) < 2:
        return False  # only the forking thread
    for tid in tids:
        try:
            fd = os.open(f"/proc/self/task/{tid}/comm", os.O_RDONLY)
        except OSError:
            continue  # a thread that just ended
        try:
            if os.read(fd, 32).startswith(STORE_THREAD):
                return True
        except OSError:
            pass
        finally:
            os.close(fd)
    return False


def wait_for_parent(fd: int) -> None:
    """In a forked child: wait for the parent's word on pipe `fd` (a byte, or the pipe's end
    once the parent closed it or died), at most BARRIER_WAIT seconds."""
    deadline = time.monotonic() + BARRIER_WAIT
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                os.read(fd, 1)  # one byte per child, or b"" once the parent is gone
                return
        except InterruptedError:
            continue
