"""A governor service process for the crash tests: production code throughout
(ServiceCore, FileStore, KubernetesScaleActuator with its background worker,
GovernorServer with an admin token, `serve` and its signal handling) except the metric
source, which reads request rates from a JSON file ({model: req/s}, re-read on every
observation; tests.service.serve_fake.FileRates).

    python -m tests.faults.serve_governor --config FILE --state-file FILE \
        --rates-file FILE --admin-token-file FILE [--kube-url URL]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from actuators.kubeapi import api_client
from actuators.kubernetes import KubernetesScaleActuator
from controller.config import load_config
from controller.logs import configure_logging
from service.core import ServiceCore
from service.security import AdminToken
from service.server import MAX_WATCH_STREAMS, GovernorServer, serve
from service.store import FileStore
from tests.service.serve_fake import FileRates


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--state-file", required=True)
    p.add_argument("--rates-file", required=True)
    p.add_argument("--kube-url", help="a fake Kubernetes API to scale through (optional)")
    p.add_argument("--admin-token-file", required=True)
    args = p.parse_args()
    configure_logging("warning")
    cfg = load_config(args.config)
    core_ref: list[ServiceCore] = []
    actuators = []
    if args.kube_url:
        actuators.append(
            KubernetesScaleActuator(
                api_client(args.kube_url),
                lambda: core_ref[0].deployments(),
                request_timeout_s=2.0,
                backoff_s=0.05,
            )
        )
    core = ServiceCore(
        cfg, FileRates(Path(args.rates_file)), FileStore(args.state_file), actuators=actuators
    )
    core_ref.append(core)
    server = GovernorServer(
        core,
        grpc_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        admin_token=AdminToken(args.admin_token_file),
        # the load test's 1,000 streams come from this one host, standing in for engines
        max_watch_streams_per_client=MAX_WATCH_STREAMS,
    )
    return serve(server, 5.0)


if __name__ == "__main__":
    sys.exit(main())
