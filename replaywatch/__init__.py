"""replaywatch: a diagnostics sidecar for RL training jobs on DeepMind Reverb."""

__version__ = "0.1.0"
