"""Process tuning for CPU work: torch threads, OpenMP spinning, malloc."""
