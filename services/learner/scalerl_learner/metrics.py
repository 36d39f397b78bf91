from prometheus_client import Counter, Gauge, Histogram

from scalerl.metrics import remove_job_series

STEP = Gauge("scalerl_learner_step", "Learner optimizer steps taken", ["job_id"])
VERSION = Gauge("scalerl_learner_policy_version", "Latest published policy version", ["job_id"])
STEP_SECONDS = Histogram("scalerl_learner_step_duration_seconds", "Wall time of one learner step", ["job_id"],
                         buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
PUBLISH_SECONDS = Histogram("scalerl_learner_weights_publish_duration_seconds",
                            "Wall time of one weights send, the staged copy to the transport's answer, by how it "
                            "went (delta or whole; `delta: auto` takes the faster)", ["job_id", "sent_as"],
                            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
PUBLISH_HELD = Counter("scalerl_learner_weights_publish_held_seconds_total",
                       "Training-loop time held by publishing: the previous version's send still running, the "
                       "copy of the weights, and the send itself when pipeline.publish_in_background is off",
                       ["job_id"])
STARVED = Counter("scalerl_learner_starved_seconds_total", "Time the learner waited for trainable groups",
                  ["job_id"])
COMPUTE = Gauge("scalerl_learner_compute_device_hours", "Device-hours spent by the job, by role",
                ["job_id", "role"])
BUDGET = Gauge("scalerl_learner_compute_budget_device_hours", "The job's compute budget", ["job_id"])
PASS_RATE = Gauge("scalerl_learner_validation_pass_rate", "Latest validation pass rate", ["job_id"])
LAST_STEP = Gauge("scalerl_learner_last_step_timestamp_seconds", "Unix time of the last step", ["job_id"])
LOSS = Gauge("scalerl_learner_loss", "Policy loss of the last step", ["job_id"])
TOKENS = Counter("scalerl_learner_trained_tokens_total", "Loss tokens trained on", ["job_id"])
SAMPLER_KL = Gauge("scalerl_learner_sampler_kl",
                   "k3 estimate of KL(generator's sampling policy || learner policy) over the last step's loss "
                   "tokens: staleness raises it a little; a jump means the generators sample with other weights "
                   "than the learner's (a weight load that did not land)", ["job_id"])
LEARNING_RATE = Gauge("scalerl_learner_learning_rate",
                      "The last step's learning rate: the recipe's lr through warmup and, with optimizer.adaptive_lr, "
                      "damped while the sampler KL runs high", ["job_id"])
MAX_IMPORTANCE_RATIO = Gauge("scalerl_learner_importance_ratio_max",
                             "Largest learner / generator token probability ratio in the last step", ["job_id"])
CLIPPED_TOKEN_RATIO = Gauge("scalerl_learner_clipped_token_ratio",
                            "Share of the last step's loss tokens whose importance ratio was clipped or truncated",
                            ["job_id"])

JOB_METRICS = (STEP, VERSION, STEP_SECONDS, PUBLISH_SECONDS, PUBLISH_HELD, STARVED, COMPUTE, BUDGET, PASS_RATE,
               LAST_STEP, LOSS, TOKENS, SAMPLER_KL, LEARNING_RATE, MAX_IMPORTANCE_RATIO, CLIPPED_TOKEN_RATIO)


def forget_job(job_id: str) -> None:
    """Remove the ended job's series, so its alerts (stalled, starved, budget) resolve and panels end with it."""
    remove_job_series(JOB_METRICS, job_id)
