"""Query execution (Hazelcast Mustang): plans, operators, initiator and participant."""

from sparkbus.roles.query.api import Query, Target, error_from_reply, load, result_table
from sparkbus.roles.query.api import sql as _sql
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.engine import Inbox, PartitionStore, read_parquet, table_from_ipc, table_to_ipc
from sparkbus.roles.query.errors import ErrorCode, ExecutionError, PlanError, QueryError, SqlError
from sparkbus.roles.query.factory import make_role
from sparkbus.roles.query.messages import (
    QueriesInactive,
    QueriesSuspected,
    QueryCancelled,
    QueryId,
    QueryStarted,
    parse_stream_key,
    stream_key,
)
from sparkbus.roles.query.plan import (
    AggCall,
    Aggregate,
    Filter,
    Fragment,
    Limit,
    MergeSort,
    PlanNode,
    Project,
    Receive,
    Scan,
    Send,
    Sort,
    SortKey,
    TopK,
    fragment_from_plain,
    fragment_to_plain,
    plan_from_plain,
    plan_to_plain,
)
from sparkbus.roles.query.planner import plan_fragments
from sparkbus.roles.query.role import QueryRole
from sparkbus.roles.query.sql import parse_sql

# Importing the submodule ``sql`` above bound the package attribute ``sql`` to it; the API function wins.
sql = _sql

__all__ = [
    "AggCall",
    "Aggregate",
    "ErrorCode",
    "ExecutionError",
    "Filter",
    "Fragment",
    "Inbox",
    "Limit",
    "MergeSort",
    "PartitionStore",
    "PlanError",
    "PlanNode",
    "Project",
    "QueriesInactive",
    "QueriesSuspected",
    "Query",
    "QueryCancelled",
    "QueryConfig",
    "QueryError",
    "QueryId",
    "QueryRole",
    "QueryStarted",
    "Receive",
    "Scan",
    "Send",
    "Sort",
    "SortKey",
    "SqlError",
    "Target",
    "TopK",
    "error_from_reply",
    "fragment_from_plain",
    "fragment_to_plain",
    "load",
    "make_role",
    "parse_sql",
    "parse_stream_key",
    "plan_fragments",
    "plan_from_plain",
    "plan_to_plain",
    "read_parquet",
    "result_table",
    "sql",
    "stream_key",
    "table_from_ipc",
    "table_to_ipc",
]
