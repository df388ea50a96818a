"""A reward function outside ``src/`` with TRL's signature, named as ``train.reward_funcs = ["toy_reward:brevity"]``."""


def brevity(completions, model_text, **_):
    """0.01 for a model text of at most 40 characters, else 0 (one value per completion)."""
    return [0.01 if len(t) <= 40 else 0.0 for t in model_text]
