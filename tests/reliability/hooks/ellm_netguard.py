"""Make every attempt to reach the network fail, and record it.

Only internet sockets are refused (AF_INET, AF_INET6) and name lookups: local
AF_UNIX sockets and socketpairs, which Qt and asyncio use inside one process,
stay allowed. With ``listen`` (a server: `ellm serve`) an internet socket may be
made and bound to a loopback address to listen on; connecting anywhere, binding
elsewhere and name lookups are still refused. Used in-process by the privacy tests (``install`` under
monkeypatch) and in subprocesses through hooks/sitecustomize.py.
"""
from __future__ import annotations

import os
import socket

INET = (socket.AF_INET, socket.AF_INET6)


class NetworkAttempt(PermissionError):
    pass


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def make_guard(attempts: list[str], log_path: str | None = None, listen: bool = False):
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
            if fileno is None and (socket.AF_INET if family == -1 else family) in INET and not listen:
                refuse(f"socket(family={family!r})")
            super().__init__(family, type, proto, fileno)

        def bind(self, address):
            if self.family in INET and address[0] not in LOOPBACK:
                refuse(f"bind({address!r})")
            return super().bind(address)

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


def install_for_process(listen: bool = False) -> None:
    """Install the guard for the rest of this process (sitecustomize)."""
    attempts: list[str] = []
    for name, replacement in make_guard(attempts, os.environ.get("ELLM_TEST_NETWORK_LOG"), listen).items():
        setattr(socket, name, replacement)
