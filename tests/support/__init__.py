"""Helpers of the tests that are not tests: source trees, JPEG samples, a real Slurm cluster and its jobs,
processes' leftovers, other users (nobody; fanfs-alice and fanfs-bob, made once), a command's messages without its
progress lines, and the scripts some tests run (a Slurm task, a daemon with a fault).

What the benchmarks use too lives in ``tools/`` (tests may import tools; tools never import tests).
"""
