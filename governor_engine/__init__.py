"""Engine-side plugins of llm-governor, loaded INSIDE a vLLM server process.

- `governor_engine.scheduler.GovernedScheduler`: the `--scheduler-cls` of vLLM's V1
  engine; follows the governor's batching knobs live (admission cap and step token budget).
- `governor_engine.middleware.LatencyDistMiddleware`: a `--middleware` that adds the
  `X-Latency-Dist` header (the governor's per-model latency distribution) to responses.

Both need only what a vLLM image already ships (grpcio and protobuf come with vLLM) plus
this package and the generated stubs in `governor_api`. `governor engine-args --live`
prints the flags. Configuration: `--additional-config '{"governor_server": "HOST:PORT"}'`
or `$GOVERNOR_SERVER`; the model is vLLM's served model name unless
`governor_model` / `$GOVERNOR_MODEL` names another.
"""
