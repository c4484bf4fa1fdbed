"""Make every attempt to reach the network fail, and record it.

Only internet sockets are refused (AF_INET, AF_INET6) and name lookups: local
AF_UNIX sockets and socketpairs, which Qt and asyncio use inside one process,
stay allowed. Used in-process by the privacy tests (``install`` under
monkeypatch) and in subprocesses through hooks/sitecustomize.py.
"""
from __future__ import annotations

import os
import socket

INET = (socket.AF_INET, socket.AF_INET6)


class NetworkAttempt(PermissionError):
    pass


def make_guard(attempts: list[str], log_path: str | None = None):
    """(replacements for socket attributes, the list that records attempts)."""

    def refuse(what: str):
        attempts.append(what)
        if log_path:
            with open(log_path, "a") as f:
                f.write(what + "\n")
        raise NetworkAttempt(f"network access is disabled here: {what}")

    real_socket = socket.socket

    class GuardedSocket(real_socket):
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None and (socket.AF_INET if family == -1 else family) in INET:
                refuse(f"socket(family={family!r})")
            super().__init__(family, type, proto, fileno)

        def connect(self, address):
            if self.family in INET:
                refuse(f"connect({address!r})")
            return super().connect(address)

        def connect_ex(self, address):
            if self.family in INET:
                refuse(f"connect_ex({address!r})")
            return super().connect_ex(address)

    def create_connection(address, *args, **kwargs):
        refuse(f"create_connection({address!r})")

    def getaddrinfo(host, port, *args, **kwargs):
        refuse(f"getaddrinfo({host!r}, {port!r})")

    def gethostbyname(host):
        refuse(f"gethostbyname({host!r})")

    return {"socket": GuardedSocket, "create_connection": create_connection, "getaddrinfo": getaddrinfo,
            "gethostbyname": gethostbyname}


def install_for_process() -> None:
    """Install the guard for the rest of this process (sitecustomize)."""
    attempts: list[str] = []
    for name, replacement in make_guard(attempts, os.environ.get("ELLM_TEST_NETWORK_LOG")).items():
        setattr(socket, name, replacement)
