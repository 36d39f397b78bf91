"""`scalerl-serve NAME` (also `python -m scalerl NAME`): run one service in this process.

Service packages register their `main(settings)` under the `scalerl.services` entry-point group, so this leaf
package finds whatever services are installed (an image holds one) without importing any of them by name.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

GROUP = "scalerl.services"


def installed_services() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def serve(service: str) -> int:
    """Run `service` until SIGTERM; 2 when it is not installed here."""
    services = installed_services()
    if service not in services:
        known = ", ".join(sorted(services)) or "none"
        print(f"error: unknown service {service!r}; installed here: {known}", file=sys.stderr)
        return 2
    from scalerl.logs import setup_logging
    from scalerl.settings import Settings

    settings = Settings(service=service)
    setup_logging(service, settings.log_level, settings.log_json)
    services[service].load()(settings)
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: scalerl-serve SERVICE   (api, generator, reward-grader, replay-buffer, learner, forecaster, "
              "weight-broadcast)", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(serve(args[0]))
