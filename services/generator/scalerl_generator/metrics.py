from prometheus_client import Counter, Gauge, Histogram

from scalerl.metrics import remove_job_series

TOKENS = Counter("scalerl_generator_tokens_generated_total", "Output tokens sampled",
                 ["job_id", "generator_id"])
IN_FLIGHT = Gauge("scalerl_generator_groups_in_flight", "Groups being generated", ["job_id", "generator_id"])
VERSION_LAG = Gauge("scalerl_generator_weight_version_lag",
                    "Current policy version minus the oldest version of a token in flight",
                    ["job_id", "generator_id"])
POLICY_VERSION = Gauge("scalerl_generator_policy_version", "Policy version loaded in the engine",
                       ["job_id", "generator_id"])
PAUSE = Histogram("scalerl_generator_update_pause_seconds", "Engine pause of an in-flight weight update",
                  ["job_id"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
INTERRUPTIONS = Counter("scalerl_generator_interruptions_total", "Completions cut by forced interruption",
                        ["job_id"])
COMPLETIONS = Counter("scalerl_generator_completions_total", "Completions by finish reason",
                      ["job_id", "finish_reason"])
IDLE = Counter("scalerl_generator_idle_seconds_total", "Time waiting on backpressure or an empty pool",
               ["job_id", "generator_id"])

LEASES_LOST = Counter("scalerl_generator_leases_lost_total",
                      "Prompts whose lease was lost (expired and leased again) before their group was written",
                      ["job_id", "generator_id"])
ENGINE_READY = Gauge("scalerl_generator_engine_ready",
                     "1 while this replica's vLLM engine is loaded, 0 while loading, failed or idle")
JOB_METRICS = (TOKENS, IN_FLIGHT, VERSION_LAG, POLICY_VERSION, PAUSE, INTERRUPTIONS, COMPLETIONS, IDLE,
               LEASES_LOST)


def start_job(job_id: str, generator_id: str) -> None:
    """Export the rollout counters at 0 from the job's start: a replica that is never idle, never loses a lease
    and never interrupts still has the series, so rate() on the dashboards reads 0 instead of no data."""
    for counter in (TOKENS, IDLE, LEASES_LOST):
        counter.labels(job_id, generator_id)
    INTERRUPTIONS.labels(job_id)


def forget_job(job_id: str) -> None:
    """Remove the ended job's series, so NoRollouts / GeneratorsIdle resolve instead of reading a frozen counter."""
    remove_job_series(JOB_METRICS, job_id)
