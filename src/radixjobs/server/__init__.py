"""The daemon: database owners, discovery, HTTP status and metrics, shutdown."""

from radixjobs.server.daemon import Daemon, DaemonConfig

__all__ = ["Daemon", "DaemonConfig"]
