"""The engine: one mechanism every configuration is made of (producers, maps, signals,
executors, kernels and their plans). It never imports ``collectives`` or ``emulator.app``."""
