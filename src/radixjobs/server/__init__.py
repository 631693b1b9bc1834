"""The daemon: database owners, discovery, HTTP status and metrics, shutdown."""

from radixjobs.server.config import DaemonConfig
from radixjobs.server.daemon import Daemon

__all__ = ["Daemon", "DaemonConfig"]
