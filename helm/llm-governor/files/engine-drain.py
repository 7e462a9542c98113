"""preStop hook of the engine pod: wait until the engine has no running or waiting request.

Usage: python3 -c "<this file>" PORT BOUND_S
Polls http://127.0.0.1:PORT/metrics each second and returns as soon as the sum of
vllm:num_requests_running and vllm:num_requests_waiting is 0, or after BOUND_S seconds,
or when /metrics cannot be read (an engine that does not answer has nothing to drain).
Kubernetes sends SIGTERM only after this returns; the pod has left the Service's
endpoints already, so no new request arrives meanwhile. Standard library only (it runs
in the vLLM image).
"""

import sys
import time
import urllib.request

NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm_num_requests_running",
    "vllm_num_requests_waiting",
)


def in_flight(port: str) -> float:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=2) as resp:
        text = resp.read().decode("utf-8", "replace")
    total = 0.0
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in NAMES:
            rest = line.rsplit("}", 1)[1] if "{" in line else line[len(name) :]
            total += float(rest.split()[0])  # value [timestamp]
    return total


def main(port: str, bound_s: float) -> None:
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        try:
            if in_flight(port) <= 0:
                return
        except Exception:
            return
        time.sleep(1)


main(sys.argv[1], float(sys.argv[2]))
