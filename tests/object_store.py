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


class FaultyS3:
    """The local S3 endpoint on two ports over one set of buckets: ``clean_url`` always
    answers; ``faulty_url`` answers 500 InternalError (as S3 does when it fails) to every
    request while ``fault`` is set, and counts them."""

    ERROR = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
        b"<Message>We encountered an internal error. Please try again.</Message></Error>"
    )

    def __init__(self) -> None:
        import threading

        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        from spanmill.stack.ports import free_port

        self.fault = threading.Event()
        self.refused = 0
        app = DomainDispatcherApplication(create_backend_app)

        def faulty(environ: dict[str, Any], start_response: Any) -> Any:
            if self.fault.is_set():
                self.refused += 1
                if environ.get("CONTENT_LENGTH"):  # read the body: the client sent it
                    environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
                elif environ.get("wsgi.input_terminated"):
                    environ["wsgi.input"].read()
                # An answer to HEAD has no body, as S3's own does not.
                body = b"" if environ["REQUEST_METHOD"] == "HEAD" else self.ERROR
                start_response(
                    "500 Internal Server Error",
                    [("Content-Type", "application/xml"),
                     ("Content-Length", str(len(body)))],
                )  # fmt: skip
                return [body]
            return app(environ, start_response)

        self._servers = [
            make_server("127.0.0.1", free_port(), handler, True, request_handler=MotoRequestHandler)
            for handler in (app, faulty)
        ]
        self._threads = [
            threading.Thread(target=server.serve_forever, daemon=True) for server in self._servers
        ]
        for thread in self._threads:
            thread.start()
        clean, bad = (f"http://127.0.0.1:{s.server_address[1]}" for s in self._servers)
        self.clean_url, self.faulty_url = clean, bad

    def options(self, url: str) -> dict[str, Any]:
        """fsspec storage options for the endpoint at ``url``."""
        return {"endpoint_url": url, "key": "test", "secret": "test",
                "client_kwargs": {"region_name": "us-east-1"}}  # fmt: skip

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
        for thread in self._threads:
            thread.join()
