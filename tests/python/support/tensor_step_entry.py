"""A real compiled entry with leaves below torch's C++ tensor accessors, shared by the tests of the
C++ tensor steps and of `to_bytes(drop=...)`: torch installs TensorPropertyGuardAccessor and
GradGuardAccessor nodes on no simple compile, so the leaves are added to a real guard tree below a
local ``z`` that has no TENSOR_MATCH (so non-tensors and subclasses reach them)."""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list


def f_two(x: Any, z: Any) -> Any:
    return x + 1


def entry_with_tensor_step_leaves() -> tuple[Any, Any, Any]:
    """Compile `f_two`, add size, stride, storage-offset and grad leaves below ``L['z']``, and
    return torch's guard manager and the two example tensors."""
    from torch._dynamo.guards import GuardManagerType

    torch._dynamo.reset()
    x, z = torch.randn(8, 3), torch.randn(8, 3)
    torch.compile(f_two, backend="eager")(x, z)
    gm = _debug_get_cache_entry_list(f_two.__code__)[0].guard_manager
    kind = GuardManagerType.GUARD_MANAGER
    zn = gm.root.framelocals_manager(key=("z", 1), source="L['z']", example_value=z, guard_manager_enum=kind)
    zn.tensor_property_size_manager(0, "L['z'].size()[0]", 8, kind).add_equals_match_guard(
        8, ["L['z'].size()[0] == 8"], None
    )
    zn.tensor_property_stride_manager(1, "L['z'].stride()[1]", 1, kind).add_equals_match_guard(
        1, ["L['z'].stride()[1] == 1"], None
    )
    zn.tensor_property_storage_offset_manager(
        None, "L['z'].storage_offset()", 0, kind
    ).add_equals_match_guard(0, ["L['z'].storage_offset() == 0"], None)
    zn.grad_manager("L['z'].grad", None, kind).add_none_match_guard(["L['z'].grad is None"], None)
    return gm, x, z
