"""A run's configuration: `RunConfig`, `key=value` parsing, the generated reference."""
