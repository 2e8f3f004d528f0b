"""The model pairs' build: training code, kept out of the decoding core (dsd/).

    python -m pairs.build --out models/default-pair     (or `dsdbed build-pair`)

corpus       the training text: the Python standard library's own sources, split by path hash
train        tokenizer, target pre-training, draft distillation, greedy agreement
common       what both families' builds share: log, versions, phase timer, output folder
stdlib_gpt2  the default pair (models/default-pair/)
smollm2      an optional pair with a pretrained target (SmolLM2-135M-Instruct)
smollm2_eagle  the same target with a one-layer feature draft: eagle_features (the target's
             layer outputs over its answers), eagle_draft (training with rollouts, held-out alpha)
build        the command line: picks the family

A built folder is checked by dsd.pair_manifest.verify_pair before any backend loads it; that
module is all the decoding core knows of this package.
"""

import os

# Before any submodule imports transformers (huggingface_hub reads it once): no build may reach
# a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
