"""Reward-grader process: stateless; verifiers run in a bounded pool of worker processes."""

from __future__ import annotations

import os

from scalerl.control import follow_active_job
from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl_reward_grader import metrics
from scalerl_reward_grader.grading import Grader
from scalerl_reward_grader.service import add_to_server


def main(settings: Settings) -> None:
    grader = Grader(workers=max(2, min(4, os.cpu_count() or 2)))  # one process each: memory grows with them
    registration = ServiceRegistration(["scalerl.v1.RewardGrader"], lambda server: add_to_server(server, grader))
    run_service(settings, registration, on_shutdown=grader.close,
                background=lambda stop: follow_active_job(settings.control_plane_addr, "reward-grader",
                                                          metrics.keep_only, stop, settings.poll_interval_s))
