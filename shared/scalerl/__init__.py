"""ScaleRL common code: recipe and settings models, gRPC/metrics bootstrap, generated stubs, CLI."""

__version__ = "0.1.0"
