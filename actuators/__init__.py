"""actuators: apply decisions (KEDA external scaler, Kubernetes scale, engine config).

May import the controller's decision types only.
"""
