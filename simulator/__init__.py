"""simulator: the plant. A fleet of simulated continuous-batching engines, traces,
baseline autoscalers and the oracle. May import estimators and controller.
"""
