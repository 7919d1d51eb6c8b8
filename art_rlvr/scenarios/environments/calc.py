"""`calc`: products of two numbers of up to six digits, far beyond what a small model can
multiply in its head, with a tool. The answer is scored by the numeric reward of the scenario's
`[reward]` table on the final reply; tool calls, errors and turns are counted.

Two tools, chosen by the `tool` parameter. `multiply(a, b)` (the default) takes two whole
numbers: under a named `tool_choice` the grammar admits only digits, so a 135M model's forced
call is valid whenever it copies the numbers. `calculator(expression)` takes free text: the same
model, forced into a string, wrote `}}` or nothing into it (0 valid calls of 50, 2026-11-23).

The calculator evaluates + - * / // % ** and parentheses over numbers by walking Python's
syntax tree (no `eval`), with bounds so that `9**9**9` is an error, not a hang.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.scenarios.environments.base import Environment

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
MAX_DIGITS = 400
# Stripped from both ends of an expression: a model forced into the tool's JSON schema often
# writes the closing braces or quotes inside the string first ('}} 967670 * 272329').
STRAY = " \t\n{}[]\"'`=?"


def bounded(value: Fraction) -> Fraction:
    if max(abs(value.numerator), value.denominator).bit_length() > MAX_DIGITS * 10 // 3:
        raise ValueError(f"a value has more than about {MAX_DIGITS} digits")
    return value


def evaluate(node: ast.AST) -> Fraction:
    """An arithmetic expression's exact value; ValueError names what is not allowed."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return Fraction(Decimal(str(node.value)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = evaluate(node.left), evaluate(node.right)
        if exponent.denominator != 1 or abs(exponent) > 64:
            raise ValueError("exponents must be whole numbers up to 64")
        return bounded(base**exponent.numerator)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = evaluate(node.left), evaluate(node.right)
        if right == 0 and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
            raise ValueError("division by zero")
        return bounded(Fraction(_BINARY[type(node.op)](left, right)))
    raise ValueError(f"not allowed in an expression: {ast.unparse(node)!r}")


def show(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.12g}"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. "123456 * 789012".

    Args:
        expression: numbers with + - * / // % ** and parentheses.
    """
    text = expression.replace("×", "*").replace("^", "**").replace(",", "").strip(STRAY)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot read {expression!r} as arithmetic") from None
    return show(evaluate(tree))


def multiply(a: int, b: int) -> str:
    """Multiply two whole numbers exactly.

    Args:
        a: the first number.
        b: the second number.
    """
    return show(bounded(Fraction(a) * Fraction(b)))


TOOLS: dict[str, Callable[..., str]] = {"multiply": multiply, "calculator": calculator}


class Calc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int = Field(default=4, ge=1)
    tool: Literal["multiply", "calculator"] = "multiply"


def environment(**params) -> Environment:
    """No environment turns: the model calls the tool as often as it likes, then answers."""
    config = Calc(**params)
    return Environment(tools=(TOOLS[config.tool],), max_turns=config.max_turns)
