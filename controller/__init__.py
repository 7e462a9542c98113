"""controller: config and SLA models, the pure decider, stages, batching, the control loop
and the `Actuator` protocol the loop drives.

May import estimators; nothing else of ours (the service, one layer up, runs it).
"""
