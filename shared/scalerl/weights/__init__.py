"""Weight transports: the interface and configs (`base`), and the registry that builds one from its config.
Each transport module is imported only when a config names it, so importing this package pulls in neither the
gRPC stubs nor torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scalerl.weights.base import (TRANSPORT_TYPES, FilesystemWeightTransportConfig, GrpcWeightTransportConfig,
                                  NamedTensors, ReceivedWeights, TorchDistributedWeightTransportConfig,
                                  WeightTransport, WeightTransportConfig, parse_transport_config)


def _grpc(config: GrpcWeightTransportConfig) -> WeightTransport:
    from scalerl.weights.grpc import GrpcStreamTransport

    return GrpcStreamTransport.from_config(config)


def _filesystem(config: FilesystemWeightTransportConfig) -> WeightTransport:
    from scalerl.weights.filesystem import FilesystemTransport

    return FilesystemTransport.from_config(config)


def _torch_distributed(config: TorchDistributedWeightTransportConfig) -> WeightTransport:
    from scalerl.weights.collective import TorchDistributedTransport

    return TorchDistributedTransport.from_config(config)


TRANSPORTS: dict[str, Callable[[Any], WeightTransport]] = {"grpc": _grpc, "filesystem": _filesystem,
                                                           "torch_distributed": _torch_distributed}


def make_transport(config: Any) -> WeightTransport:
    """The transport `config` names (a WeightTransportConfig variant or its dict form)."""
    config = parse_transport_config(config)
    return TRANSPORTS[config.type](config)


__all__ = ["FilesystemWeightTransportConfig", "GrpcWeightTransportConfig", "NamedTensors", "ReceivedWeights",
           "TorchDistributedWeightTransportConfig", "WeightTransport", "WeightTransportConfig", "make_transport",
           "parse_transport_config"]
