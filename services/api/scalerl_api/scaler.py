"""Scale the generator Deployment through the Kubernetes scale subresource.

The api (REST `POST /v1/admin/generators/scale`) and the `scalerl scale generators N` CLI call
`GeneratorScaler.scale`. Generators are stateless and pull the active job from the control plane, so
changing the replica count is all that is needed: new pods join, removed pods' prompt leases expire and
return to the pool (replay-buffer lease_seconds).

RBAC: the api's ServiceAccount needs `get` and `patch` on `deployments/scale` in the release namespace
(the Helm chart grants exactly that Role).
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client, config

MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "scalerl-api"


class ScaleRefused(ValueError):
    """The requested replica count is outside [min_replicas, max_replicas]; nothing was sent."""

    def __init__(self, requested: object, min_replicas: int, max_replicas: int) -> None:
        self.requested = requested
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        super().__init__(
            f"refusing to scale generators to {requested!r}: replicas must be an integer "
            f"between {min_replicas} and {max_replicas} (min_replicas..max_replicas)"
        )


class ScaleFailed(RuntimeError):
    """The Kubernetes API rejected or failed the request (status carries the HTTP status)."""

    def __init__(self, action: str, status: int | None, reason: str) -> None:
        self.status = status
        super().__init__(f"{action} failed: HTTP {status}: {reason}")


@dataclass(frozen=True)
class ScaleTarget:
    namespace: str
    deployment: str


def _default_api_client() -> client.ApiClient:
    """In-cluster ServiceAccount config when running in a pod, else the local kubeconfig."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class GeneratorScaler:
    """get/set the replica count of the generator Deployment, within configured bounds."""

    def __init__(
        self,
        namespace: str,
        deployment: str = "scalerl-generator",
        min_replicas: int = 0,
        max_replicas: int = 64,
        api_client: client.ApiClient | None = None,
    ) -> None:
        if min_replicas < 0 or max_replicas < min_replicas:
            raise ValueError(f"invalid bounds: min_replicas={min_replicas}, max_replicas={max_replicas}")
        self.target = ScaleTarget(namespace=namespace, deployment=deployment)
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self._api_client = api_client
        self._apps: client.AppsV1Api | None = None

    @property
    def apps(self) -> client.AppsV1Api:
        if self._apps is None:
            self._apps = client.AppsV1Api(self._api_client or _default_api_client())
        return self._apps

    def check(self, replicas: object) -> int:
        """Return `replicas` if allowed, else raise ScaleRefused (bools and non-integers are refused)."""
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise ScaleRefused(replicas, self.min_replicas, self.max_replicas)
        if not self.min_replicas <= replicas <= self.max_replicas:
            raise ScaleRefused(replicas, self.min_replicas, self.max_replicas)
        return replicas

    def get_replicas(self) -> int:
        """The desired replica count (spec.replicas of the scale subresource)."""
        try:
            scale = self.apps.read_namespaced_deployment_scale(self.target.deployment, self.target.namespace)
        except client.ApiException as exc:
            raise ScaleFailed(f"reading scale of deployment {self.target.deployment}", exc.status, exc.reason) from exc
        return int(scale.spec.replicas or 0)

    def scale(self, replicas: int) -> int:
        """Set the desired replica count; returns what the API server accepted. Bounds are checked first."""
        replicas = self.check(replicas)
        try:
            scale = self.apps.patch_namespaced_deployment_scale(
                self.target.deployment,
                self.target.namespace,
                {"spec": {"replicas": replicas}},
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
            )
        except client.ApiException as exc:
            raise ScaleFailed(f"scaling deployment {self.target.deployment}", exc.status, exc.reason) from exc
        return int(scale.spec.replicas or 0)
