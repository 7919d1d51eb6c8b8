"""Chat rendering (messages and tools to token ids, tool calls back out) and chat templates."""
