"""graphopt: ordering and placing the ops of computation graphs to save memory or time.

Modules, in dependency order: ``graph`` (IR and JSON file), ``perfmodel`` (peak memory and the
multi-device simulator), ``decoders`` (random keys -> schedules, the Problem), ``brkga``,
``baselines``, ``exact`` (CP-SAT), ``features``, ``policy`` (the graph network, numpy
inference and its weights file), ``learned`` (BRKGA steered by it), ``train`` (policy
gradients, needs torch), ``evaluate`` and ``cli``; ``corpus`` builds graph sets. graphopt
imports nothing of timerl but itself and ``timerl.errors``.
Nothing is imported here so that ``timerl --help`` stays fast.
"""
