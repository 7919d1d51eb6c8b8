"""Engines past TorchBackend that a run reaches over the network: SkyRL's Tinker-API engine
(`backend=tinker` on your own machines, `engines.skyrl`), ART's Tinker backend with supervised
steps for expert iteration (`engines.tinker`), and vLLM as an external policy endpoint
(`engines.vllm`). Each module imports its heavy dependencies only when a function runs."""
