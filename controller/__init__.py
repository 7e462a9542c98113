"""controller: config and SLA models, the pure decider, the control loop, the CLI.

May import estimators; nothing else of ours.
"""
