"""Reward-grader process: stateless; verifiers run on a worker pool inside the process."""

from __future__ import annotations

from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl_reward_grader.grading import Grader
from scalerl_reward_grader.service import add_to_server


def main(settings: Settings) -> None:
    grader = Grader()
    registration = ServiceRegistration(["scalerl.v1.RewardGrader"], lambda server: add_to_server(server, grader))
    run_service(settings, registration, on_shutdown=grader.close)
