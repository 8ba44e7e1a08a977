"""tsproxy: an S3-compatible storage sidecar for Kafka tiered storage."""

__version__ = "0.1.0"
