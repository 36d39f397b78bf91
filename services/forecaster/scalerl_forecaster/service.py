"""The Forecaster gRPC servicer: decodes each request, calls `Forecasts`, returns its answer."""

from __future__ import annotations

from scalerl.v1 import forecaster_pb2, forecaster_pb2_grpc
from scalerl_forecaster.jobs import Forecasts


class ForecasterService(forecaster_pb2_grpc.ForecasterServicer):
    def __init__(self, forecasts: Forecasts):
        self.forecasts = forecasts

    def AddPoint(self, request, context):
        return self.forecasts.add_point(request.point, request.recipe_json, request.eval_set)

    def GetForecast(self, request, context):
        return self.forecasts.forecast(request.job_id, request.eval_set)

    def GetCurve(self, request, context):
        return forecaster_pb2.Curve(job_id=request.job_id, points=self.forecasts.points(request.job_id, request.eval_set),
                                    eval_set=request.eval_set or "iid", eval_sets=self.forecasts.eval_sets(request.job_id))

    def GetCorrelations(self, request, context):
        return self.forecasts.correlations(request.job_id, request.level if request.level > 0 else 0.95)

    def GetDecision(self, request, context):
        return self.forecasts.decision(request.job_id, request.target if request.target > 0 else None)

    def Compare(self, request, context):
        return self.forecasts.compare(list(request.job_ids), request.level if request.level > 0 else 0.95)


def add_to_server(server, forecasts: Forecasts) -> ForecasterService:
    """Register a ForecasterService over `forecasts` on `server`."""
    service = ForecasterService(forecasts)
    forecaster_pb2_grpc.add_ForecasterServicer_to_server(service, server)
    return service
