"""Multi-turn environments for scenarios, found by name from a TOML `[environment]` table."""

from collections.abc import Mapping

from art_rlvr.scenarios.environments import (
    arith_retry,
    calc,
    humaneval_repair,
    mcp_tools,
    qa_search,
    tictactoe,
)
from art_rlvr.scenarios.environments.base import (
    Environment,
    EnvironmentConfigError,
    EnvironmentFactory,
    Reply,
    assistant_texts,
    build_environment,
)

ENVIRONMENTS: dict[str, EnvironmentFactory] = {
    "arith_retry": arith_retry.environment,
    "calc": calc.environment,
    "humaneval_repair": humaneval_repair.environment,
    "mcp": mcp_tools.environment,
    "qa_search": qa_search.environment,
    "tictactoe": tictactoe.environment,
}


def make_environment(name: str, params: Mapping[str, object] | None = None) -> Environment:
    return build_environment(name, dict(params or {}), ENVIRONMENTS)


__all__ = [
    "ENVIRONMENTS",
    "Environment",
    "EnvironmentConfigError",
    "Reply",
    "assistant_texts",
    "make_environment",
]
