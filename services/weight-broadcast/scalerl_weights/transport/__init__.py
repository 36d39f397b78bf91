from scalerl_weights.transport.base import ReceivedWeights, WeightTransport, make_transport

__all__ = ["ReceivedWeights", "WeightTransport", "make_transport"]
