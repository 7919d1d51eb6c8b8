"""What a task is: scenario files, sources, rewards, environments, mixtures."""
