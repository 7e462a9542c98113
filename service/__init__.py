"""service: the running governor: core (targets, loop, board, persistence, leadership),
gRPC server and ticker, admin API, `governor` CLI, store, leader election, security.

Top layer: may import estimators, controller, actuators and simulator.
"""
