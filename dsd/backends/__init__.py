"""Model backends behind one small interface (``dsd.backends.protocol.LanguageModel``).

torch_lm   any Hugging Face causal LM (the default offline pair, SmolLM2, a user's own pair)
synthetic  no weights: a deterministic target stream and a draft right with probability alpha
"""
