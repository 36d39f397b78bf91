"""Forecaster process: every job's points and fits in memory, persisted under $SCALERL_DATA_DIR/forecaster."""

from __future__ import annotations

from pathlib import Path

from scalerl.control import follow_active_job
from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl_forecaster.jobs import Forecasts
from scalerl_forecaster.service import add_to_server


def main(settings: Settings) -> None:
    forecasts = Forecasts(state_dir=Path(settings.data_dir) / "forecaster")
    run_service(settings, ServiceRegistration(["scalerl.v1.Forecaster"], lambda s: add_to_server(s, forecasts)),
                background=lambda stop: follow_active_job(  # only the active job's metrics are exported
                    settings.control_plane_addr, "forecaster", forecasts.export_only, stop, settings.poll_interval_s))
