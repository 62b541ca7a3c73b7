"""The op table's argument positions match the installed torch's real signatures."""

from __future__ import annotations

import inspect

import pytest
from mycroft.instrumentation.ops import C10D_SPECS, FUNCOL_SPECS, NO_ARG, OpSpec


def _check(function: object, spec: OpSpec) -> None:
    parameters = list(inspect.signature(function).parameters)  # type: ignore[arg-type]
    for field in ("payload", "group", "async_op", "peer", "group_peer", "root", "group_root", "reduce_op"):
        ref = getattr(spec, field)
        if ref == NO_ARG:
            continue
        position, keyword = ref
        assert keyword in parameters, f"{spec.api}: no parameter {keyword!r}"
        if position >= 0:
            assert parameters.index(keyword) == position, f"{spec.api}.{keyword} is not at {position}"


@pytest.mark.parametrize("spec", C10D_SPECS, ids=lambda spec: spec.api)
def test_c10d_positions(spec: OpSpec) -> None:
    import torch.distributed.distributed_c10d as c10d

    _check(getattr(c10d, spec.api), spec)


@pytest.mark.parametrize("spec", FUNCOL_SPECS, ids=lambda spec: spec.api)
def test_funcol_positions(spec: OpSpec) -> None:
    import torch.distributed._functional_collectives as funcol

    _check(getattr(funcol, spec.api), spec)
