"""Planning (IR -> immutable ExecutionPlan) and running (plan + feeds -> outputs)."""

from .plan import ExecutionPlan, build_plan

__all__ = ["ExecutionPlan", "build_plan"]
