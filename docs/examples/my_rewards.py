"""The reward of docs/examples/mine.toml: R(x, y) -> a bool (True is reward 1 and correct)."""


def capital(x: dict, y: str) -> bool:
    return y.strip().rstrip(".").lower() == x["answer"].lower()
