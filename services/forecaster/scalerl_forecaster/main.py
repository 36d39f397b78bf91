"""Forecaster process: every job's points and fits in memory, persisted under $SCALERL_DATA_DIR/forecaster."""

from __future__ import annotations

import threading
from pathlib import Path

from scalerl.control import ControlPlaneClient, ControlPlaneUnavailable
from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl_forecaster.jobs import Forecasts
from scalerl_forecaster.service import add_to_server


def export_active_job(settings: Settings, forecasts: Forecasts, stop: threading.Event) -> None:
    """Follow the control plane's active job: only its metrics are exported, an ended job's are removed."""
    control = ControlPlaneClient(settings.control_plane_addr, "forecaster")
    try:
        while not stop.wait(settings.poll_interval_s):
            try:
                active = control.active_job()
            except ControlPlaneUnavailable:
                continue  # unknown is not "no job": keep what is exported
            forecasts.export_only(active.job_id if active is not None else None)
    finally:
        control.close()


def main(settings: Settings) -> None:
    forecasts = Forecasts(state_dir=Path(settings.data_dir) / "forecaster")
    run_service(settings, ServiceRegistration(["scalerl.v1.Forecaster"], lambda s: add_to_server(s, forecasts)),
                background=lambda stop: export_active_job(settings, forecasts, stop))
