"""Typed settings for every service, from env (SCALERL_*) and flags. Addresses never hard-coded elsewhere."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from scalerl.weights.base import GrpcWeightTransportConfig, WeightTransportConfig

# (gRPC port, metrics port) per service on a single host; in Kubernetes each pod uses its own defaults too. All lie
# below every kernel's ephemeral range (Linux 32768-60999, IANA and macOS 49152-65535): an outgoing connection's local
# port could otherwise hold a default port before its service binds it (see scalerl.ports).
DEFAULT_PORTS: dict[str, tuple[int, int]] = {
    "api": (18050, 9100),
    "generator": (18051, 9101),
    "reward-grader": (18052, 9102),
    "replay-buffer": (18053, 9103),
    "learner": (18054, 9104),
    "forecaster": (18055, 9105),
    "weight-broadcast": (18056, 9106),
    "evaluator": (18057, 9107),
}
DEFAULT_HTTP_PORT = 8000
"""The api's REST port unless SCALERL_HTTP_PORT says otherwise."""
SERVICES = ("api", "reward-grader", "replay-buffer", "weight-broadcast", "forecaster", "learner", "generator")


def _addr(service: str) -> str:
    return f"127.0.0.1:{DEFAULT_PORTS[service][0]}"


class EngineSettings(BaseModel):
    """A generator's vLLM engine (SCALERL_ENGINE__<FIELD>). The model, its dtype and max_model_len come from the
    job's recipe; these are properties of the machine the generator runs on. Field names are
    GenerationEngine's keyword arguments."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs one engine shards the model over (the chart sets it to generator.gpus)."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of each GPU's memory vLLM may use for weights, activations and KV cache; sizes the KV cache when
    kv_cache_gib is 0."""
    kv_cache_gib: float = Field(default=1.0, ge=0)
    """KV cache of one engine in GiB; 0: what gpu_memory_utilization leaves after weights and activations (GPU
    only: the CPU backend needs a size)."""
    enforce_eager: bool = True
    """True: eager PyTorch (CPU, quick start); False: CUDA graphs (faster decoding, longer warm-up)."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Most sequences in one engine step; None: vLLM's default."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SCALERL_", extra="ignore", use_attribute_docstrings=True,
                                      env_nested_delimiter="__")

    service: str = "api"
    """Which service this process runs (set by `scalerl serve NAME`)."""
    host: str = "127.0.0.1"
    """Bind address of the gRPC and metrics servers (0.0.0.0 in containers)."""
    grpc_port: int | None = Field(default=None, ge=0, le=65535)
    """0 picks a free port; unset means the service's default."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    http_port: int = Field(default=DEFAULT_HTTP_PORT, ge=0, le=65535)
    """api only: REST port."""
    log_level: str = "INFO"
    log_json: bool = True

    control_plane_addr: str = _addr("api")
    replay_buffer_addr: str = _addr("replay-buffer")
    reward_grader_addr: str = _addr("reward-grader")
    weight_broadcast_addr: str = _addr("weight-broadcast")
    forecaster_addr: str = _addr("forecaster")
    evaluator_addr: str = _addr("evaluator")
    learner_addr: str = _addr("learner")
    weight_transport: WeightTransportConfig = Field(default_factory=GrpcWeightTransportConfig)
    """How the learner publishes weights and generators receive them (SCALERL_WEIGHT_TRANSPORT__TYPE=grpc|filesystem|
    torch_distributed, SCALERL_WEIGHT_TRANSPORT__ROOT=..., ...). gRPC without an address goes to
    `weight_broadcast_addr`."""

    redis_url: str = Field(default="redis://127.0.0.1:6379/0",
                           validation_alias=AliasChoices("REDIS_URL", "SCALERL_REDIS_URL"))
    database_url: str = "sqlite:///var/scalerl.db"
    api_token: str = "scalerl-dev-token"
    """Bearer token every REST call must present."""
    data_dir: Path = Path("var")
    """Checkpoints, built models, plots."""

    generator_role: str = Field(default="rollout", pattern="^(rollout|evaluator)$")
    generator_id: str = ""
    poll_interval_s: float = Field(default=1.0, gt=0)
    """How often services poll the control plane for the active job."""
    drain_timeout_s: float = Field(default=10.0, ge=0)
    """On SIGTERM, how long in-flight RPCs may finish."""
    torch_threads: int = Field(default=1, ge=1)
    """Intra-op threads of torch (learner, generator); the chart sets it from the pod's CPU request."""
    engine: EngineSettings = Field(default_factory=EngineSettings)
    """Generator only: vLLM engine settings (SCALERL_ENGINE__TENSOR_PARALLEL_SIZE=2, ...)."""
    max_groups_in_flight: int = Field(default=64, ge=1)
    """Generator: prompt groups sampled concurrently (continuous batching), within the buffer's backpressure
    (which caps what all generators hold together). Bigger batches spread the engine's per-step cost: on the
    2-core box the demo steps ~10 % faster at 64 than at 16 (docs/benchmarks/generator.md)."""

    # Kubernetes generator scaler (api).
    k8s_namespace: str = "default"
    k8s_generator_deployment: str = "scalerl-generator"
    generator_min_replicas: int = Field(default=1, ge=0)
    generator_max_replicas: int = Field(default=64, ge=1)

    @field_validator("weight_transport", mode="before")
    @classmethod
    def _transport_type_defaults_to_grpc(cls, value):
        # SCALERL_WEIGHT_TRANSPORT__CHUNK_BYTES alone tunes the default transport
        return {"type": "grpc", **value} if isinstance(value, dict) and "type" not in value else value

    @model_validator(mode="after")
    def _grpc_transport_defaults_to_the_broadcast_service(self) -> "Settings":
        if isinstance(self.weight_transport, GrpcWeightTransportConfig) and not self.weight_transport.addr:
            self.weight_transport = self.weight_transport.model_copy(update={"addr": self.weight_broadcast_addr})
        return self

    def ports(self) -> tuple[int, int]:
        key = "evaluator" if self.service == "generator" and self.generator_role == "evaluator" else self.service
        grpc_default, metrics_default = DEFAULT_PORTS.get(key, (0, 0))
        return (self.grpc_port if self.grpc_port is not None else grpc_default,
                self.metrics_port if self.metrics_port is not None else metrics_default)
