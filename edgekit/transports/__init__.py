"""Transports: how edgekit reaches a board (ssh, adb, or this machine).

One small interface (:class:`~edgekit.transports.base.Transport`); paramiko and
adbutils are imported only when their transport is opened.

    with open_transport("root@10.0.0.7:22", key="~/.ssh/id_ed25519") as t:
        t.run(["uname", "-a"])
"""

from __future__ import annotations

from edgekit.transports.base import HostKeyError, Transport, TransportError, open_transport

__all__ = ["HostKeyError", "Transport", "TransportError", "open_transport"]
