"""verifiers environments as scenarios (`scenario=verifiers:<taskset>`, a `[verifiers]` table,
or `verifiers_task(...)`): a verifiers 0.4 taskset's tasks become the records of a `Task` whose
rollout function runs each one as a verifiers episode against the policy's endpoint and scores
it with the task's rubric. verifiers itself is imported only when such a scenario loads.
"""

from art_rlvr.rollouts.verifiers.load import load_any, runners_of, verifiers_scenario
from art_rlvr.rollouts.verifiers.spec import VerifiersSpec, is_verifiers_scenario

__all__ = ["VerifiersSpec", "is_verifiers_scenario", "load_any", "runners_of", "verifiers_scenario"]
