from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, status

from scalerl_api.schemas import UNAVAILABLE, ScaleOut, ScaleRequest

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post("/generators/scale", response_model=ScaleOut, responses=UNAVAILABLE)
def scale_generators(body: ScaleRequest, request: Request) -> ScaleOut:
    from scalerl_api.scaler import GeneratorScaler, ScaleRefused  # kubernetes client: only when used

    settings = request.app.state.settings
    try:
        scaler = GeneratorScaler(namespace=settings.k8s_namespace, deployment=settings.k8s_generator_deployment,
                                 min_replicas=settings.generator_min_replicas,
                                 max_replicas=settings.generator_max_replicas)
        replicas = scaler.scale(body.replicas)
    except ScaleRefused as err:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY,
                            [{"loc": ["body", "replicas"], "msg": str(err), "type": "value_error"}]) from err
    except Exception as err:  # no cluster reachable (e.g. the local stack)
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"cannot scale generators: {err}") from err
    return ScaleOut(deployment=settings.k8s_generator_deployment, replicas=replicas)
