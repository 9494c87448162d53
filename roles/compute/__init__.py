"""Compute control (Materialize): controller, replica, command history, dataflows.

The controller (``compute.controller``) keeps tables and views and answers peeks and subscribes; replicas
(``compute.replica``) maintain the views incrementally and answer from their arrangements. See
docs/COMPUTE.md.
"""

from sparkbus.roles.compute.arrangement import DIFF, TIME, Arrangement, decode_table, encode_table
from sparkbus.roles.compute.controller import TARGET_FAILED, ComputeController
from sparkbus.roles.compute.dataflow import Dataflow
from sparkbus.roles.compute.factories import make_controller, make_replica
from sparkbus.roles.compute.history import CommandHistory
from sparkbus.roles.compute.keyed import KeyedArrangement, index_arrangement
from sparkbus.roles.compute.messages import (
    AllowCompaction,
    AllowWrites,
    AppendUpdates,
    CancelPeek,
    ComputeCommand,
    ComputeResponse,
    CreateDataflow,
    CreateInstance,
    CreateTimely,
    Frontiers,
    InitializationComplete,
    Peek,
    PeekResponse,
    PeekResult,
    Schedule,
    Status,
    SubscribeBatch,
    SubscribeDropped,
    TargetKind,
    UpdateConfiguration,
)
from sparkbus.roles.compute.plans import Aggregate, Finishing, MapExpr, Predicate, SortKey, ViewDef
from sparkbus.roles.compute.reduction import ViewError
from sparkbus.roles.compute.replica import ComputeReplica
from sparkbus.roles.compute.stages import Stage, StageError

__all__ = [
    "DIFF",
    "TARGET_FAILED",
    "TIME",
    "Aggregate",
    "AllowCompaction",
    "AllowWrites",
    "AppendUpdates",
    "Arrangement",
    "CancelPeek",
    "CommandHistory",
    "ComputeCommand",
    "ComputeController",
    "ComputeReplica",
    "ComputeResponse",
    "CreateDataflow",
    "CreateInstance",
    "CreateTimely",
    "Dataflow",
    "Finishing",
    "Frontiers",
    "InitializationComplete",
    "KeyedArrangement",
    "MapExpr",
    "Peek",
    "PeekResponse",
    "PeekResult",
    "Predicate",
    "Schedule",
    "SortKey",
    "Stage",
    "StageError",
    "Status",
    "SubscribeBatch",
    "SubscribeDropped",
    "TargetKind",
    "UpdateConfiguration",
    "ViewDef",
    "ViewError",
    "decode_table",
    "encode_table",
    "index_arrangement",
    "make_controller",
    "make_replica",
]
