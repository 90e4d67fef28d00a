"""Buckets on the local S3 endpoint (the ``s3`` fixture) for tests of stores on it."""

from __future__ import annotations

from typing import Any


def s3_bucket(options: dict[str, Any]) -> str:
    """A new bucket on the local S3 endpoint; its store URL."""
    import uuid

    import boto3

    bucket = f"spans-{uuid.uuid4().hex[:8]}"
    boto3.client(
        "s3",
        endpoint_url=options["endpoint_url"],
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/store"
