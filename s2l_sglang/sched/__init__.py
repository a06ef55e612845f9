"""Engine-independent scheduling: snapshots, policies, the pure plan step, preemption costs.

Nothing in this package imports sglang or torch. `s2l_sglang/scheduling.py` (in SGLang's
scheduler process) builds the `ReqView`s and applies the `Plan`s; `s2l_sglang/profile.py`
measures the cost model that `costmodel.py` loads.
"""

from __future__ import annotations

from s2l_sglang.sched.costmodel import (
    CostModel,
    PiecewiseLinear,
    ProfileKey,
    ProfileStore,
    find_profile,
)
from s2l_sglang.sched.planner import choose_victims, plan
from s2l_sglang.sched.policy import Policy, get_policy, policy_names, register
from s2l_sglang.sched.preemption import (
    Preemption,
    get_preemption,
    preemption_names,
    register_preemption,
)
from s2l_sglang.sched.snapshot import Grant, Plan, ReqView

__all__ = [
    "CostModel",
    "Grant",
    "PiecewiseLinear",
    "Plan",
    "Policy",
    "Preemption",
    "ProfileKey",
    "ProfileStore",
    "ReqView",
    "choose_victims",
    "find_profile",
    "get_policy",
    "get_preemption",
    "plan",
    "policy_names",
    "preemption_names",
    "register",
    "register_preemption",
]
