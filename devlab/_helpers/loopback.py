"""Listening sockets on loopback only: what devlab hands torch's stores, which bind every
interface when they make their own socket, whatever host they are given."""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one ("localhost", 127.0.0.1, ::1)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    try:
        return bool(infos) and all(
            ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)
    except ValueError:
        return False


def loopback_socket(addr: str, port: int = 0) -> socket.socket:
    """A socket listening on `addr` (a loopback host) and `port` (0: any free one), only there.

    A name is bound at its IPv4 address when it has one ("localhost": 127.0.0.1), which is
    where clients that try each of its addresses in turn reach it."""
    infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    family, _, _, _, sockaddr = min(infos, key=lambda i: i[0] != socket.AF_INET)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # as torch's own store does: a port whose last store's connections linger in
        # TIME_WAIT (a framework that starts its ranks twice on one MASTER_PORT) binds again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock
