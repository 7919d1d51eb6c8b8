"""The litellm chat client for reflection and teachers, and the endpoints it calls."""
