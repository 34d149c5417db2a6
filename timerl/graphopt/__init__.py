"""graphopt: ordering and placing the ops of computation graphs to save memory or time.

Modules, in dependency order: ``graph`` (IR and JSON file), ``perfmodel`` (peak memory and the
multi-device simulator), ``decoders`` (random keys -> schedules, the Problem), ``brkga``,
``baselines``, ``exact`` (CP-SAT), ``evaluate`` and ``cli``; ``corpus`` builds graph sets.
Nothing is imported here so that ``timerl --help`` stays fast.
"""
