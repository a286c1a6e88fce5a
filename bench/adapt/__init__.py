"""Adapting a draft to its target (`tandem adapt`, issue 45): the teacher data (`data`: the
target's own answers to deployment-like prompts), the memory plan and the training run
(`train`), and the proof on held-out prompts (`proof`)."""
