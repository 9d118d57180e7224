"""The bounded PySpark job: read exact Kafka offset ranges, transform, write an idempotent sink."""
