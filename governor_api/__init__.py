"""Generated gRPC stubs of llm-governor's API (governor.v1) and KEDA's external-scaler
contract (externalscaler). Do not edit the `*_pb2*.py` files: edit `proto/` and run
`make proto` (python -m governor_api._generate); a test fails when they are stale.
"""
