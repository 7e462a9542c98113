"""actuators: apply decisions and serve them: the decision board, KEDA's external scaler,
the engines' BatchingService, the Kubernetes scale actuator and its API call helpers.

May import the controller and estimators only.
"""
