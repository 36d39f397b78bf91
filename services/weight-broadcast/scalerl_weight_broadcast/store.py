"""Versions held in memory per job: the store the hub shares with every generator's relay."""

from scalerl.weights.chunked import ChunkedVersion, Incoming, VersionStore

__all__ = ["ChunkedVersion", "Incoming", "VersionStore"]
