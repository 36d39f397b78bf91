"""The Forecaster gRPC servicer: decodes each request, calls `Forecasts`, returns its answer."""

from __future__ import annotations

from scalerl.v1 import forecaster_pb2, forecaster_pb2_grpc
from scalerl_forecaster.jobs import Forecasts


class ForecasterService(forecaster_pb2_grpc.ForecasterServicer):
    def __init__(self, forecasts: Forecasts):
        self.forecasts = forecasts

    def AddPoint(self, request, context):
        return self.forecasts.add_point(request.point, request.recipe_json)

    def GetForecast(self, request, context):
        return self.forecasts.forecast(request.job_id)

    def GetCurve(self, request, context):
        return forecaster_pb2.Curve(job_id=request.job_id, points=self.forecasts.points(request.job_id))


def add_to_server(server, forecasts: Forecasts) -> ForecasterService:
    """Register a ForecasterService over `forecasts` on `server`."""
    service = ForecasterService(forecasts)
    forecaster_pb2_grpc.add_ForecasterServicer_to_server(service, server)
    return service
