"""Test plugin: a configuration that runs the GEMM and forgets its collective (the wrong
result a numerics check must fail)."""

import dataclasses

from collectives.registry import REGISTRY
from emulator.engine.registry import Configuration


def _gemm_only(p, op, algorithm):
    plan = REGISTRY.configurations["sequential"].build(p, op, algorithm)
    return dataclasses.replace(plan, phases=plan.phases[:1])


REGISTRY.add_configuration(Configuration(
    "no-collective", "the GEMM without its collective (test plugin)", "example", _gemm_only))
