"""Run (or resume) one small GEPA run in its own process: the kill-and-resume test's subject.

usage: python gepa_resume_run.py RUN_DIR CONFIG_JSON SEED_PROMPT RESULT_JSON
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WEAVE_DISABLED", "true")


async def main(run_dir: Path, config_json: str, seed_prompt: str, out: Path) -> None:
    import art

    from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend, load_scenario
    from art_rlvr.gepa import GEPAConfig, optimize_prompt

    backend = TorchBackend(path=run_dir / ".art", seed=0)
    model = art.TrainableModel(
        name="resume", project="tests", run_name="resume", base_model=DEFAULT_BASE_MODEL
    )
    try:
        await model.register(backend)
        result = await optimize_prompt(
            model,
            load_scenario("arith", seed=0),
            seed_prompt=seed_prompt,
            config=GEPAConfig.model_validate_json(config_json),
            run_dir=run_dir / "gepa",
        )
    finally:
        await backend.close()
    out.write_text(result.model_dump_json())


if __name__ == "__main__":
    run_dir, config_json, seed_prompt, out = sys.argv[1:5]
    asyncio.run(main(Path(run_dir), config_json, seed_prompt, Path(out)))
