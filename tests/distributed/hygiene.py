"""What a process holds, read from the kernel's own tables: its threads, file descriptors,
listening sockets and child processes; and this machine's addresses beyond loopback.

Shared by the tests of `devlab.launch` in the test process and in a real Jupyter kernel
(which imports this file by path). Never imports devlab.
"""

from __future__ import annotations

import ipaddress
import os
import socket

import psutil


def descriptors(pid: int | None = None) -> list[tuple[int, str]]:
    """(fd, what it is) for every open descriptor, from /proc (the listing's own fd left out)."""
    folder = f"/proc/{pid or os.getpid()}/fd"
    found = []
    for name in os.listdir(folder):
        try:
            found.append((int(name), os.readlink(f"{folder}/{name}")))
        except OSError:  # the descriptor os.listdir used, closed again
            continue
    return sorted(found)


def listeners(pid: int | None = None) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on."""
    return sorted((c.laddr.ip, c.laddr.port)
                  for c in psutil.Process(pid or os.getpid()).net_connections("tcp")
                  if c.status == psutil.CONN_LISTEN)


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%")[0]).is_loopback


def beyond_loopback() -> str | None:
    """An IPv4 address of this machine that is not loopback (192.0.2.2 on the test machine),
    or None where it has none."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not is_loopback(a.address):
                return a.address
    return None


def refused(address: str, port: int) -> bool:
    """Whether connecting to address:port is refused (nothing listens there for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect((address, port))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False


def state(pid: int | None = None) -> dict[str, object]:
    """Everything a launch could leave behind in a process."""
    import threading

    proc = psutil.Process(pid or os.getpid())
    return {
        "os_threads": proc.num_threads(),
        "threads": sorted(t.name for t in threading.enumerate()) if pid is None else None,
        "descriptors": descriptors(pid),
        "listeners": listeners(pid),
        # The watcher of this process's entry in the simulated machine's register lives as long
        # as the simulation (devlab.engine.simulated.base.machine), not as a launch.
        "children": sorted(p.pid for p in proc.children(recursive=True)
                           if not _register_watcher(p)),
    }


def _register_watcher(p: psutil.Process) -> bool:
    """Whether `p` is the simulated machine's register watcher of its parent."""
    try:
        return "devlab-gpus-" in " ".join(p.cmdline())
    except psutil.Error:
        return False
