"""The GPU rehearsal's reward (verl's custom_reward_function): the fraction of the ground truth's digits that the
response contains, so that a tiny random model gets a score that moves."""


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    digits = [c for c in str(ground_truth) if c.isdigit()]
    if not digits:
        return 0.0
    return sum(1 for c in digits if c in solution_str) / len(digits)
