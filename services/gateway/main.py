"""Container entry point of the gateway: settings from SPANMILL_* variables."""

from spanmill.cli.gateway import gateway

if __name__ == "__main__":
    gateway(host=None, port=None, routing_file=None)  # type: ignore[arg-type]
