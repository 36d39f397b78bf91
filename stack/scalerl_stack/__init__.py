"""The local stack and the operator's command: `scalerl up/down/demo/submit/status/...`, the supervisor."""
